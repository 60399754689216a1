"""An hvdlite backend for Ray Train's data-parallel trainers (what Ray dropped with its Horovod
trainer): DataParallelTrainer(train_loop, backend_config=HvdliteConfig(), scaling_config=...)
starts Ray Train's workers as usual, and the train loop calls hvd.init() and hvdlite's
collectives. Needs ray (`pip install hvdlite[ray]`).

Built on Ray Train's public backend API only (ray.train.backend.Backend and BackendConfig, and
the methods of BaseWorkerGroup: execute, execute_single, execute_single_async), which Ray Train
v1 and v2 both drive, so it works with either. On each start of the worker group (a first start,
or a restart after a worker failure, which Ray Train's FailureConfig governs) the backend:
  - asks every worker for its Ray node id and address;
  - numbers the hvdlite ranks as Ray Train numbers its workers (hvd.rank() ==
    ray.train.get_context().get_world_rank()), with local and cross ranks over Ray nodes by the
    core's rule (hvdlite.common.job.topology);
  - draws a fresh secret and has the rank-0 worker host the store on a free port of its node's
    address, kept in that worker process until on_shutdown;
  - writes each worker's job into its environment (hvdlite.common.job.write), so hvd.init() in
    the train loop forms the job as under hvdliterun.
on_shutdown shuts hvdlite down in every worker and stops the store. HvdliteConfig.timeout_s
bounds hvd.init()'s wait for the other ranks (HVDLITE_START_TIMEOUT).
"""

import os
from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig

from hvdlite.common import job as jobs

_store_server: Any = None  # the rank-0 worker's store, from on_start to on_shutdown


def _node() -> tuple[str, str]:
    import ray

    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def _host_store(secret_hex: str, clients: int) -> int:
    global _store_server
    from hvdlite.common.native import core as _core

    _store_server = _core.TcpStoreServer("0.0.0.0", 0, bytes.fromhex(secret_hex), clients=clients)
    return int(_store_server.port)


def _set_job(job: jobs.Job, timeout_s: int) -> None:
    jobs.write(os.environ, job)
    os.environ["HVDLITE_START_TIMEOUT"] = str(timeout_s)


def _shutdown() -> None:
    global _store_server
    from hvdlite.common import basics

    if basics.is_initialized():
        basics.shutdown()
    if _store_server is not None:
        _store_server.stop()
        _store_server = None


@dataclass
class HvdliteConfig(BackendConfig):
    """Ray Train backend config for hvdlite (module doc). timeout_s: how long hvd.init() waits
    for all ranks."""

    timeout_s: int = 300

    @property
    def backend_cls(self) -> type:
        return _HvdliteBackend

    def to_dict(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s}


def _four(local: Any) -> tuple[int, int, int, int]:
    """(local rank, local size, cross rank, cross size) of one row of jobs.topology()."""
    local_rank, local_size, cross_rank, cross_size = local
    return local_rank, local_size, cross_rank, cross_size


class _HvdliteBackend(Backend):
    """Hands Ray Train's workers their hvdlite job (module doc)."""

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        import ray

        timeout_s = getattr(backend_config, "timeout_s", HvdliteConfig.timeout_s)

        nodes = worker_group.execute(_node)
        size = len(nodes)
        secret = os.urandom(32).hex()
        port = worker_group.execute_single(0, _host_store, secret, 2 * size)
        store_addr = "%s:%d" % (nodes[0][1], port)
        topology = jobs.topology([node_id for node_id, _ in nodes])
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    _set_job,
                    jobs.Job(rank, size, *_four(topology[rank]), store_addr=store_addr, secret=secret),
                    timeout_s,
                )
                for rank in range(size)
            ]
        )

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        worker_group.execute(_shutdown)
