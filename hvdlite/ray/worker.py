"""Horovod's horovod.ray.worker: BaseHorovodWorker, the class behind every static Ray worker
actor (the strategies in strategy.py make it a Ray actor, one per rank).

Horovod's methods keep their names and meaning (node_id, hostname, get_gpu_ids, update_env_vars,
env_vars, start_executable, execute, set_queue); hvdlite adds what its rendezvous needs: node()
(the node id and the address the store is reached at), host_store() (rank 0's actor hosts the
job's store for the actor's lifetime) and set_env() (the job description, which hvd.init()
reads). Every method runs in the actor's process, one call at a time (Ray's default actor
concurrency), so no method needs a lock.
"""

import os
import socket
from collections.abc import Callable
from typing import Any

from hvdlite.common import job as jobs
from hvdlite.ray import ray_logger


class BaseHorovodWorker:
    """One rank's worker (module doc). world_rank/world_size are Horovod's constructor
    arguments; the rank hvd.init() uses comes from set_env (ranks are renumbered host-major
    once the actors' nodes are known)."""

    executable: Any = None

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        self.world_rank, self.world_size = world_rank, world_size
        self._server: Any = None

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def node(self) -> tuple[str, str]:
        """(Ray node id, this node's address)."""
        import ray

        return self.node_id(), str(ray.util.get_node_ip_address())

    def hostname(self) -> str:
        return socket.gethostname()

    def get_gpu_ids(self) -> list[int]:
        """The GPU ids Ray gave this worker."""
        import ray

        return [int(i) for i in ray.get_gpu_ids()]

    def update_env_vars(self, env_vars: dict[str, Any]) -> None:
        os.environ.update({k: str(v) for k, v in env_vars.items()})

    def env_vars(self) -> dict[str, str]:
        return dict(os.environ)

    def host_store(self, secret_hex: str, clients: int) -> int:
        """Starts the job's store server on a free port of every interface; returns the port.
        The server lives as long as this actor."""
        from hvdlite.common.native import core as _core

        self._server = _core.TcpStoreServer("0.0.0.0", 0, bytes.fromhex(secret_hex), clients=clients)
        return int(self._server.port)

    def set_env(self, job: jobs.Job, extra: dict[str, str]) -> None:
        """extra, then the job description, into this process's environment (hvd.init() reads it)."""
        os.environ.update(extra)
        jobs.write(os.environ, job)

    def start_executable(
        self,
        executable_cls: type | None = None,
        executable_args: list[Any] | None = None,
        executable_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """`self.executable = executable_cls(*args, **kwargs)`; None without a class."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()), **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """func(self.executable)."""
        return func(self.executable)

    def run(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        return fn(*(args or ()), **(kwargs or {}))

    def set_queue(self, queue: Any) -> None:
        """Where ray_logger.log sends values (hvdlite/ray/callbacks.py); None: nowhere."""
        ray_logger.configure(queue)
