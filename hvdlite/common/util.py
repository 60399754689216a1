"""Horovod's horovod.common.util helpers that its framework packages re-export
(hvd.split_list, hvd.check_num_rank_power_of_2, hvd.handle_average_backwards_compatibility,
hvd.gpu_available, hvd.check_extension): framework-neutral, shared by every adapter.
"""

from collections.abc import Callable

from hvdlite.common import dtypes, exceptions
from hvdlite.common.optimizer_policy import split_list
from hvdlite.common.reduction import resolve_op

# Framework name -> its adapter's GPU check, registered by the adapter when it is imported
# (register_gpu_check). `common` never loads an adapter: it asks only those already loaded.
_GPU_CHECKS: dict[str, Callable[[], bool]] = {}


def register_gpu_check(framework, check):
    """Called by a framework adapter at import: check() says whether that framework sees a GPU
    in this process (Horovod's per-extension _check_has_gpu)."""
    _GPU_CHECKS[framework] = check


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
        """Horovod's handle_average_backwards_compatibility(op, average): the reduce op that
        `op` and the deprecated `average` argument mean (see get_average_backwards_compatibility_fun)."""
        return resolve_op(op, average, reduce_ops.Average, reduce_ops)

    return impl


handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(dtypes)


def framework_of(ext_base_name):
    """The framework a Horovod extension name stands for: 'mpi_lib' and 'tensorflow.mpi_lib'
    are TensorFlow's, 'torch.mpi_lib_v2' is torch's."""
    name = "tensorflow" if ext_base_name in ("mpi_lib", "tensorflow.mpi_lib") else ext_base_name
    return name.split(".")[0]


def gpu_available(ext_base_name, verbose=False):
    """Whether framework `ext_base_name` ('tensorflow', 'torch', or Horovod's extension names such
    as 'mpi_lib' for TensorFlow) sees a GPU in this process. Answered by that framework's adapter
    (hvdlite.torch, hvdlite.tensorflow) once it is imported; False for a framework whose adapter
    is not imported in this process, or that hvdlite has no adapter for."""
    check = _GPU_CHECKS.get(framework_of(ext_base_name))
    available = bool(check()) if check is not None else False
    if verbose:
        print("Extension %s %s running with GPU." % (ext_base_name, "was" if available else "was NOT"))
    return available


def check_extension(ext_name, ext_env_var, pkg_path, *args):
    """Horovod's build check: ImportError naming ext_name when hvdlite's core extension cannot be
    loaded (pkg_path and args, Horovod's library path, are accepted and unused: hvdlite has one
    core library for every framework)."""
    try:
        from hvdlite.common.native import core  # noqa: F401  (the import is the check)
    except ImportError as e:
        raise exceptions.ExtensionNotBuiltError(
            "Extension %s has not been built: %s (%s is Horovod's build switch; hvdlite has no "
            "per-framework build)." % (ext_name, e, ext_env_var)
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
