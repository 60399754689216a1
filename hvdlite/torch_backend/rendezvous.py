"""``init_process_group(...)`` with no init_method under a launcher that hvd.init() knows but
torch does not (hvdliterun/horovodrun, mpirun, srun, Ray, Spark): torch's default ``env://``
rendezvous needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, which those launchers do not
set. This wraps torch's env:// handler: where MASTER_ADDR is set (torchrun, or a user's own
variables) it is torch's handler unchanged; otherwise, when an hvdlite launcher started the
process, hvd.init() joins the job and rank 0 hosts the torch store every group of the job uses,
its address handed to the others through hvdlite's broadcast. Any backend benefits, not only
"hvdlite". Bounded by torch's rendezvous timeout and HVDLITE_START_TIMEOUT.
"""

import importlib
import os
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore as _TCPStore  # type: ignore[attr-defined]

from hvdlite.common import basics, launch_setup, launchers, objects

# The module: the package torch.distributed exports a function of the same name.
_torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")
_torch_env_handler: Any = None


def _hvdlite_launched():
    try:
        return launchers.detect(os.environ).name is not None
    except launchers.LauncherEnvError:
        return False


def _store_address():
    """This rank's address that the job's other ranks reach (towards the hvdlite store)."""
    addr = os.environ.get("HVDLITE_STORE_ADDR") or os.environ.get("HOROVOD_STORE_ADDR")
    if basics.size() == 1 or not addr:
        return "127.0.0.1"
    return launch_setup.route_address(addr.rpartition(":")[0])


def _env_or_hvdlite(url, timeout=timedelta(minutes=30), **kwargs):
    if "MASTER_ADDR" in os.environ or not _hvdlite_launched():
        yield from _torch_env_handler(url, timeout=timeout, **kwargs)
        return
    basics.init()
    rank, size = basics.rank(), basics.size()
    if rank == 0:
        store = _TCPStore(
            "0.0.0.0", 0, size, is_master=True, timeout=timeout, wait_for_workers=False, use_libuv=True
        )
        objects.broadcast_object((_store_address(), store.port), 0, name="c10d.store")
    else:
        host, port = objects.broadcast_object(None, 0, name="c10d.store")
        store = _TCPStore(host, port, size, is_master=False, timeout=timeout, wait_for_workers=False)
    yield (store, rank, size)


def install():
    """Wraps torch's env:// rendezvous (idempotent)."""
    global _torch_env_handler
    if _torch_env_handler is not None:
        return
    _torch_env_handler = _torch_rendezvous._rendezvous_handlers["env"]
    _torch_rendezvous._rendezvous_handlers["env"] = _env_or_hvdlite
