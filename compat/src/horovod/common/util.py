"""horovod.common.util: Horovod's public helpers, answered by hvdlite (its test files import `env`,
`_cache`, `extension_available`, `gloo_built`, `mpi_built`; scripts use the version and build
checks). hvdlite has one core library for every framework, so the extension questions are asked
of that core and of whether the framework itself imports."""

import functools
import importlib
import importlib.util
import os
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hvdlite.common import capabilities
from hvdlite.common import util as _hvdlite_util

# Horovod's extension base names; mxnet has no hvdlite adapter (extension_available says False).
EXTENSIONS = ["tensorflow", "torch", "mxnet"]
_ADAPTERS = {"tensorflow": "hvdlite.tensorflow", "torch": "hvdlite.torch"}

check_extension = _hvdlite_util.check_extension
get_average_backwards_compatibility_fun = _hvdlite_util.get_average_backwards_compatibility_fun
num_rank_is_power_2 = _hvdlite_util.num_rank_is_power_2
split_list = _hvdlite_util.split_list


def _cache(f: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's memoizer: f's result per (args, kwargs), computed once (kwargs must be hashable)."""
    results: dict[Any, Any] = {}

    @functools.wraps(f)
    def cached(*args: Any, **kwargs: Any) -> Any:
        key = (args, frozenset(kwargs.items()))
        if key not in results:
            results[key] = f(*args, **kwargs)
        return results[key]

    return cached


def get_ext_suffix() -> str:
    """The file suffix of this interpreter's extension modules (e.g. .cpython-311-x86_64-linux-gnu.so)."""
    return str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def get_extension_full_path(pkg_path: str, *args: str) -> str:
    """Horovod's path of a framework extension library: args joined under pkg_path's directory,
    the last one given the extension suffix. hvdlite has no per-framework library; kept for scripts
    that build the name."""
    parts = list(args)
    parts[-1] += get_ext_suffix()
    return os.path.join(os.path.dirname(os.path.abspath(pkg_path)), *parts)


def _framework_base(ext_base_name: str) -> str:
    name = ext_base_name.split(".")[0]
    return "tensorflow" if name == "mpi_lib" else name


@_cache
def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether Horovod's support for framework ext_base_name ('tensorflow', 'torch', 'mxnet') is
    usable: hvdlite has an adapter for it, the framework is installed and hvdlite's core imports.
    Does not import the framework."""
    name = _framework_base(ext_base_name)
    available = name in _ADAPTERS and importlib.util.find_spec(name) is not None
    if available:
        try:
            check_extension(name, "HOROVOD_WITH_" + name.upper(), __file__)
        except ImportError:
            available = False
    if verbose:
        print("Extension %s %s built." % (ext_base_name, "has been" if available else "has NOT been"))
    return available


@_cache
def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether framework ext_base_name sees a GPU here. As Horovod's does, this loads the
    framework's extension (hvdlite's adapter, which registers the check that
    hvdlite.common.util.gpu_available asks) when it is not loaded yet; False when it cannot be."""
    framework = _hvdlite_util.framework_of(ext_base_name)
    adapter = {"tensorflow": "hvdlite.tensorflow", "torch": "hvdlite.torch"}.get(framework)
    if adapter is not None:
        try:
            importlib.import_module(adapter)
        except ImportError:
            return False
    return bool(_hvdlite_util.gpu_available(ext_base_name, verbose))


@_cache
def mpi_built(verbose: bool = False) -> bool:
    """True when hvdlite's core was built with its MPI backend."""
    return bool(capabilities.mpi_built())


@_cache
def gloo_built(verbose: bool = False) -> bool:
    """True: hvdlite's own ring backend plays Gloo's part and is in every build."""
    return bool(capabilities.gloo_built())


@_cache
def nccl_built(verbose: bool = False) -> int:
    """The NCCL version code hvdlite's CUDA module was built against; 0 without that module."""
    return int(capabilities.nccl_built())


@_cache
def ddl_built(verbose: bool = False) -> bool:
    return bool(capabilities.ddl_built())


@_cache
def ccl_built(verbose: bool = False) -> bool:
    return bool(capabilities.ccl_built())


@contextmanager
def env(**kwargs: str | None) -> Iterator[None]:
    """Sets the given environment variables (None values are skipped) for the with block, then
    restores each to its previous value, or unsets it where it was unset."""
    updates = {k: v for k, v in kwargs.items() if v is not None}
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def check_installed_version(name: str, version: str, exception: Exception | None = None) -> str:
    """Horovod's check that framework `name` at runtime is the `version` it was built against.
    hvdlite's core serves every framework version, so there is nothing to mismatch; returns the
    installed version (raises `exception` when given and the framework is missing)."""
    try:
        return str(importlib.import_module(name).__version__)
    except ImportError:
        if exception is not None:
            raise exception from None
        raise


def is_iterable(x: Any) -> bool:
    """Whether iter(x) works."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


@_cache
def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Horovod's: version string `ver` >= `target` (ValueError for a non-string). Needs the
    `packaging` package, as Horovod's does (pip and pytest bring it)."""
    from packaging import version

    if not all(isinstance(v, str) for v in (ver, target)):
        raise ValueError("This function only accepts string arguments.")
    return bool(version.parse(ver) >= version.parse(target))
