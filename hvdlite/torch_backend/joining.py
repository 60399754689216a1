"""How a torch process group finds hvdlite's runtime: the one runtime of the process, which
``hvd.*`` calls share.

- hvd.init() already ran: the default group must span the same job (same rank, same size).
- A launcher hvd.init() knows started the process (hvdliterun/horovodrun, mpirun, srun,
  torchrun, Ray, Spark: their variables are in the environment): hvd.init() joins that job.
- Otherwise (``init_process_group(init_method="tcp://...", rank=r, world_size=n)`` or an explicit
  ``store=``): the job forms through torch's own store (launch_setup.join_through).
Every wait is bounded by torch's timeout for the group (and HVDLITE_START_TIMEOUT in the core).
"""

import os

from hvdlite.common import basics, exceptions, launch_setup, launchers

_STORE_KEY = "hvdlite/job"


def _store_host(store):
    """The host of the TCPStore under torch's prefix stores, or None (FileStore, HashStore)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return getattr(store, "host", None)


def _launcher_knows_job(env):
    try:
        plan = launchers.detect(env)
    except launchers.LauncherEnvError:
        return False
    return plan.name is not None


def join(store, rank, size, timeout):
    """Makes sure this process belongs to an hvdlite job of `size` ranks in which it is `rank`
    (the default group's rank and size torch gives). Blocks at most `timeout` (a timedelta)."""
    if not basics.is_initialized():
        if size > 1 and not _launcher_knows_job(os.environ):
            host = _store_host(store)
            address = launch_setup.route_address(host) if host else "127.0.0.1"
            launch_setup.join_through(
                rank,
                size,
                lambda text: store.set(_STORE_KEY, text),
                lambda: store.get(_STORE_KEY).decode(),
                address,
                timeout.total_seconds(),
            )
        basics.init()
    if (basics.rank(), basics.size()) != (rank, size):
        raise exceptions.InvalidArgumentError(
            "init_process_group('hvdlite'): torch places this process at rank %d of %d, but its hvdlite "
            "job (hvd.init(), from the launcher's variables) has it at rank %d of %d; start both from "
            "the same launcher, or pass no rank/world_size of your own"
            % (rank, size, basics.rank(), basics.size())
        )
