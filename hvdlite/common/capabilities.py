"""What this build and this job support: Horovod's ``*_built()`` / ``*_enabled()`` queries.

``*_built()`` answer for the installation (work before init()); ``*_enabled()`` for the
job this process is in (False before init()). gloo_* report hvdlite's native ring backend,
which serves where Horovod's Gloo would. hvdlite has no DDL, oneCCL or ROCm path: those
answer False, so Horovod scripts that branch on them take the generic path.
"""

from hvdlite.common import exceptions
from hvdlite.common.native import core as _core

# MPI_THREAD_MULTIPLE's value in Open MPI and MPICH alike.
_MPI_THREAD_MULTIPLE = 3


def _built(key):
    return bool(_core.build_info().get(key, False))


def mpi_built():
    """True when hvdlite was built with its mpi backend (an MPI was found at build time)."""
    return _built("mpi")


def mpi_enabled():
    """True when the current job uses MPI: it was started by mpirun (formed through MPI,
    and by default running large CPU collectives on MPI), or its CPU collectives run on
    the mpi backend (HVDLITE_CPU_OPERATIONS=mpi)."""
    return bool(_core.mpi_enabled())


def mpi_threads_supported():
    """True when MPI runs with MPI_THREAD_MULTIPLE, so the script may use mpi4py while
    hvdlite's background thread runs MPI collectives. Raises PreconditionError when
    MPI is not in use in this process."""
    level = _core.mpi_thread_level()
    if level < 0:
        raise exceptions.PreconditionError(
            "MPI is not in use in this process: launch with mpirun (or hvdliterun --mpi) and call "
            "hvd.init() first"
        )
    return level >= _MPI_THREAD_MULTIPLE


def nccl_built():
    """Horovod's value: the NCCL_VERSION_CODE (an int, e.g. 23203 for NCCL 2.32.3) of the
    NCCL hvdlite's NCCL/CUDA module was built against, when that module is installed beside
    the core; 0 otherwise. Truthy exactly when the module is there."""
    return int(_core.build_info().get("nccl_version", 0)) if _built("nccl") else 0


def cuda_built():
    """True when hvdlite's CUDA kernels were built (they ship with the NCCL module)."""
    return _built("cuda")


def gloo_built():
    """Horovod's "was the Gloo controller built?". hvdlite has no Gloo: its native ring
    backend (ring collectives over hvdlite's own transports, shared memory between ranks
    on one host and TCP across hosts, launched by hvdliterun without MPI) plays that part.
    Every build includes it, so this is True; it is read from the core's build info
    (its "ring" entry) like the other `*_built()` queries."""
    return _built("ring")


def gloo_enabled():
    """True when this job's CPU collectives may run on the native ring backend (any
    CPU_OPERATIONS other than mpi); False before init()."""
    from hvdlite.common import settings

    return _core.is_initialized() and gloo_built() and settings.get("CPU_OPERATIONS").strip().lower() != "mpi"


def rocm_built():
    """Horovod's "was ROCm support built?": always False (hvdlite has no ROCm backend)."""
    return False


def ddl_built():
    """Horovod's "was IBM DDL built?": always False (hvdlite has no DDL backend)."""
    return False


def ccl_built():
    """Horovod's "was oneCCL built?": always False (hvdlite has no oneCCL backend)."""
    return False
