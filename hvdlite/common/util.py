"""Horovod's horovod.common.util helpers that its framework packages re-export
(hvd.split_list, hvd.check_num_rank_power_of_2, hvd.handle_average_backwards_compatibility,
hvd.gpu_available, hvd.check_extension): framework-neutral, shared by every adapter.
"""

import importlib

from hvdlite.common import dtypes, exceptions
from hvdlite.common.optimizer_policy import split_list
from hvdlite.common.reduction import resolve_op

# Horovod's extension base names -> the hvdlite adapter module that answers for that framework.
_ADAPTERS = {"tensorflow": "hvdlite.tensorflow", "torch": "hvdlite.torch"}


def num_rank_is_power_2(num_rank):
    """True when num_rank is a power of two (Horovod's Adasum precondition)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


check_num_rank_power_of_2 = num_rank_is_power_2


def get_average_backwards_compatibility_fun(reduce_ops=dtypes):
    """Horovod's: a function (op, average) -> op for the deprecated average= argument, the rule
    every hvdlite collective applies (reduction.resolve_op): both given, ValueError
    (InvalidArgumentError); average alone, DeprecationWarning and Average or Sum; neither,
    Average."""

    def impl(op, average):
        return resolve_op(op, average, reduce_ops.Average, reduce_ops)

    return impl


handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(dtypes)


def gpu_available(ext_base_name, verbose=False):
    """Whether framework `ext_base_name` ('tensorflow', 'torch', or Horovod's extension names such
    as 'mpi_lib' for TensorFlow) sees a GPU in this process; False for a framework hvdlite has no
    adapter for. Imports the adapter (and so the framework) when it is not loaded yet."""
    name = "tensorflow" if ext_base_name in ("mpi_lib", "tensorflow.mpi_lib") else ext_base_name
    name = name.split(".")[0]
    module = _ADAPTERS.get(name)
    if module is None:
        return False
    try:
        check = getattr(importlib.import_module(module), "_check_has_gpu", None)
    except ImportError:
        check = None
    available = bool(check()) if check is not None else False
    if verbose:
        print("Extension %s %s running with GPU." % (ext_base_name, "was" if available else "was NOT"))
    return available


def check_extension(ext_name, ext_env_var, pkg_path, *args):
    """Horovod's build check: ImportError naming ext_name when hvdlite's core extension cannot be
    loaded (pkg_path and args, Horovod's library path, are accepted and unused: hvdlite has one
    core library for every framework)."""
    try:
        importlib.import_module("hvdlite._core")
    except ImportError as e:
        raise exceptions.ExtensionNotBuiltError(
            "Extension %s has not been built: hvdlite's core (hvdlite._core) cannot be imported (%s). "
            "Build it with `make install` (%s is Horovod's build switch; hvdlite has no per-framework "
            "build)." % (ext_name, e, ext_env_var)
        ) from e


__all__ = [
    "check_extension",
    "check_num_rank_power_of_2",
    "get_average_backwards_compatibility_fun",
    "gpu_available",
    "handle_average_backwards_compatibility",
    "num_rank_is_power_2",
    "split_list",
]
