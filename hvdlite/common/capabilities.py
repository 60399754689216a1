"""Horovod's capability queries (mpi_built, gloo_enabled, ...), answered for
hvdlite's own backends from the build (hvdlite._core.build_info()) and the
CPU_OPERATIONS setting. hvdlite's native ring backend over its own TCP
transport plays the role Horovod's Gloo backend plays, so gloo_* report it.
"""
from hvdlite import _core
from hvdlite.common import exceptions, settings


def _built(backend):
    return bool(_core.build_info().get(backend, False))


def _cpu_backend():
    return settings.get("CPU_OPERATIONS").strip().lower()


def mpi_built():
    """True if this build has the MPI backend."""
    return _built("mpi")


def mpi_enabled():
    """True if this job runs its CPU collectives over MPI."""
    return mpi_built() and _cpu_backend() == "mpi"


def mpi_threads_supported():
    """Whether MPI was initialized with multi-threading support; raises
    ValueError (as Horovod does) when MPI is not in use."""
    if not mpi_enabled():
        raise exceptions.InvalidArgumentError(
            "hvdlite's MPI backend is not enabled; build it with MPI and set HVDLITE_CPU_OPERATIONS=mpi")
    return True


def gloo_built():
    """True: the native ring backend (hvdlite's counterpart of Gloo) is always built."""
    return _built("ring")


def gloo_enabled():
    """True if this job runs its CPU collectives over the native ring backend."""
    return gloo_built() and _cpu_backend() != "mpi"


def nccl_built():
    return _built("nccl")


def cuda_built():
    return _built("cuda")


def ddl_built():
    return False


def ccl_built():
    return False


def rocm_built():
    return False
