"""init/shutdown and the topology queries, shared by every adapter."""

import atexit

from hvdlite.common import exceptions, launch_setup, naming, ops
from hvdlite.common import process_sets as ps
from hvdlite.common.native import core as _core
from hvdlite.common.topology import (
    cross_rank,
    cross_size,
    is_homogeneous,
    local_rank,
    local_size,
    rank,
    size,
)

__all__ = [
    "cross_rank",
    "cross_size",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]

_atexit_registered = False
# Set by hvdlite.elastic in elastic workers: called as hook(_core.init) instead of
# _core.init(), it points init() at the elastic driver's newest generation of the job
# (setting HVDLITE_RANK/SIZE/STORE_ADDR/SECRET) and retries when that one is superseded.
_init_hook = None
_static_sets_failed = False  # the last init(process_sets=...) raised (see _register_static)


def set_init_hook(hook):
    """Installs `hook(core_init) -> (code, message)` for init() (hvdlite.elastic uses it)."""
    global _init_hook
    _init_hook = hook


def init(comm=None, process_sets=None):
    """Joins the job described by the launcher's environment: hvdliterun
    (or HVDLITE_RANK/SIZE/STORE_ADDR/SECRET from any launcher), mpirun,
    torchrun and what sets its variables, or Slurm's srun, found in that
    order (hvdlite.common.launchers, docs/launchers.md); a plain
    ``python script.py`` is a 1-process job. Blocks until every rank has
    joined, at most HVDLITE_START_TIMEOUT seconds. Calling it again while
    initialized does nothing; after shutdown() it starts a new session.

    ``process_sets``: optional list of ProcessSet objects (or rank lists) to
    register right away, as Horovod's init(process_sets=...) does: every rank
    must give the same sets, none a duplicate, else every rank raises a
    ValueError naming them; the job stays initialized with the global set
    and init(process_sets=...) may be called again. "dynamic" (Horovod's) registers none: add_process_set() always works.
    ``comm`` is Horovod's: an mpi4py communicator of every process of an
    mpirun job (COMM_WORLD or a duplicate; it becomes
    global_process_set.mpi_comm); sub-communicators and rank lists are not
    supported (launch the ranks you want instead).
    """
    global _atexit_registered
    if comm is not None and not hasattr(comm, "Get_group"):
        raise exceptions.NotSupportedError(
            "init(comm=<list of ranks>) is not supported: launch the ranks you want "
            "with hvdliterun and call init() or init(process_sets=...)"
        )
    if isinstance(process_sets, str) and process_sets.lower() == "dynamic":
        process_sets = None
    if _core.is_initialized():
        if _static_sets_failed:  # the last init(process_sets=...) raised: it may be called again
            _register_static(comm, process_sets)
        return
    launch_setup.prepare()  # torchrun, srun: their variables become the job description
    code, message = _init_hook(_core.init) if _init_hook is not None else _core.init()
    if code != exceptions.OK:  # a ValueError, as Horovod's failed init (init_error_for)
        raise exceptions.init_error_for(code, message)
    naming.reset()
    ops.start_session()
    if not _atexit_registered:
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True
    ps._reset_registry()
    _register_static(comm, process_sets)


def _register_static(comm, process_sets):
    """init()'s communicator and process sets. When the sets are refused (every rank raises
    alike: the check is collective) the job stays initialized with the global set only, and
    init(process_sets=...) may be called again, as in Horovod."""
    global _static_sets_failed
    try:
        ps.set_global_comm(comm)
    except exceptions.NotSupportedError:
        shutdown()  # every rank: the same communicator spans the same processes everywhere
        raise
    _static_sets_failed = False
    if process_sets:
        try:
            ps.register_static(process_sets)
        except exceptions.InvalidArgumentError:
            _static_sets_failed = True
            raise


def shutdown():
    """Leaves the job: waits (at most HVDLITE_SHUTDOWN_TIMEOUT_SECONDS) for the
    other ranks to shut down too, then closes every connection. Operations
    still pending fail with HvdliteInternalError."""
    code, message = _core.shutdown()
    exceptions.raise_for_status(code, message)


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome trace (open it in Perfetto or chrome://tracing)
    of every tensor: queueing, negotiation, fusion copies and the collective
    with its algorithm. As in Horovod, call it on every rank; rank 0 writes
    the file. HVDLITE_TIMELINE=file does the same from init()."""
    code, message = _core.start_timeline(str(file_path), bool(mark_cycles))
    exceptions.raise_for_status(code, message)


def stop_timeline():
    """Stops the timeline and closes its file."""
    code, message = _core.stop_timeline()
    exceptions.raise_for_status(code, message)


def _shutdown_at_exit():
    try:
        _core.shutdown()
    except Exception:  # interpreter teardown: nothing useful to report
        pass


def is_initialized():
    """Whether init() has run in this process and shutdown() has not."""
    return bool(_core.is_initialized())


# Horovod's internal {process set id: ranks}; its tests reach it as hvd.mpi_ops._basics.
_get_process_set_ids_and_ranks = ps.ids_and_ranks


def runtime_stats():
    """Counters of the current job since init(), as a dict: ``allreduce_responses``
    (allreduce responses this rank executed), ``allreduce_tensors`` (the tensors they
    carried), ``fused_responses`` (those carrying more than one tensor),
    ``scheduled_responses`` (responses of any kind run from the steady-state schedule,
    without the round trip to the coordinator: HVDLITE_STEADY_STATE), ``voted_responses``
    (of those, the small allreduces reduced from the inputs the ranks' votes carried,
    without a collective of their own), ``alltoall_bytes_sent`` (bytes this rank's alltoalls
    sent to other members: what sharded embedding tables exchange), and on rank 0
    ``cache_entries`` and ``cache_evictions`` of the response cache (0 elsewhere).
    An hvdlite extension (Horovod has no such call); raises when not initialized."""
    code, message, stats = _core.stats()
    exceptions.raise_for_status(code, message)
    return stats
