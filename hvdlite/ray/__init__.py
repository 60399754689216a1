"""hvdlite on Ray: RayExecutor with Horovod 0.28.1's API (horovod.ray.RayExecutor). Needs ray
(`pip install hvdlite[ray]`) and ray.init() done by the caller.

How a job forms (docs/launchers.md, "Ray"): the executor reserves one placement group (num_workers
bundles of cpus_per_worker packed, or num_hosts bundles of num_workers_per_host workers spread one
per node), starts one actor per worker in it, and numbers them host-major (the workers of a Ray
node get consecutive ranks; local and cross ranks follow Horovod's definitions over Ray's nodes).
The driver draws the secret; the rank-0 actor hosts the store on a free port of its node's address
for the executor's lifetime; every actor gets the job description in its environment through
hvdlite.common.job.write, so the function it runs calls hvd.init() as under hvdliterun. Ray
schedules and places everything; hvdlite starts no process of its own.

With min_workers (and max_workers) the executor is elastic: start() and run() go to
hvdlite.ray.elastic.ElasticAdapter (Horovod's elastic_v2), which runs hvdlite's elastic driver with
Ray actors as workers; ElasticRayExecutor (Horovod's older elastic API) is there too.
`callbacks` are accepted and never called.
"""

import collections
import os
import socket
from collections.abc import Callable
from typing import Any

from hvdlite.common import exceptions
from hvdlite.common import job as jobs
from hvdlite.ray.elastic import ElasticAdapter, ElasticRayExecutor, RayHostDiscovery

__all__ = ["ElasticAdapter", "ElasticRayExecutor", "RayExecutor", "RayHostDiscovery"]

MiniSettings = collections.namedtuple(
    "MiniSettings", "ssh_identity_file timeout_s placement_group_timeout_s nics elastic"
)


class _Worker:
    """The actor of one rank (made a Ray actor class by RayExecutor.start)."""

    def __init__(self) -> None:
        self.executable: Any = None
        self._server: Any = None

    def node(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def host_store(self, secret_hex: str, clients: int) -> int:
        from hvdlite.common.native import core as _core

        self._server = _core.TcpStoreServer("0.0.0.0", 0, bytes.fromhex(secret_hex), clients=clients)
        return int(self._server.port)

    def set_env(self, job: jobs.Job, extra: dict[str, str]) -> None:
        os.environ.update(extra)
        jobs.write(os.environ, job)

    def start_executable(self, cls: Any, args: Any, kwargs: Any) -> None:
        if cls is not None:
            self.executable = cls(*(args or ()), **(kwargs or {}))

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.executable)

    def run(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        return fn(*(args or ()), **(kwargs or {}))

    def hostname(self) -> str:
        return socket.gethostname()


def _topology(nodes: list[str]) -> list[tuple[int, int, int, int]]:
    """(local rank, local size, cross rank, cross size) per rank, ranks host-major over `nodes`
    (the node of each rank, consecutive per node)."""
    order = list(dict.fromkeys(nodes))
    counts = [nodes.count(n) for n in order]
    out = []
    for rank, node in enumerate(nodes):
        local = rank - nodes.index(node)
        holders = [i for i, c in enumerate(counts) if c > local]
        out.append((local, counts[order.index(node)], holders.index(order.index(node)), len(holders)))
    return out


class RayExecutor:
    """Horovod's horovod.ray.RayExecutor over hvdlite (module doc)."""

    @classmethod
    def create_settings(
        cls,
        timeout_s: int = 30,
        ssh_identity_file: str | None = None,
        ssh_str: str | None = None,
        placement_group_timeout_s: int = 100,
        nics: Any = None,
    ) -> MiniSettings:
        """Horovod's MiniSettings: timeout_s bounds hvd.init()'s wait for the other ranks; the ssh
        arguments are accepted and unused (Ray starts the workers)."""
        return MiniSettings(ssh_identity_file, timeout_s, placement_group_timeout_s, nics, False)

    def __init__(
        self,
        settings: Any,
        num_workers: int | None = None,
        num_hosts: int | None = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: int = 1,
        use_gpu: bool = False,
        gpus_per_worker: int | None = None,
        use_current_placement_group: bool = True,
        min_workers: int | None = None,
        max_workers: int | None = None,
        reset_limit: int | None = None,
        cooldown_range: list[int] | None = None,
        elastic_timeout: int = 600,
        override_discovery: bool = True,
    ) -> None:
        self._elastic: ElasticAdapter | None = None
        if max_workers is not None and not min_workers:
            raise exceptions.InvalidArgumentError("max_workers needs a positive min_workers (elastic jobs)")
        if min_workers is not None:
            if num_workers is not None or num_hosts is not None:
                raise exceptions.InvalidArgumentError(
                    "give either min_workers (elastic) or num_workers/num_hosts (static), not both"
                )
            self._elastic = ElasticAdapter(
                settings,
                min_workers,
                max_workers,
                use_gpu,
                cpus_per_worker,
                gpus_per_worker,
                override_discovery,
                reset_limit,
                cooldown_range,
                elastic_timeout,
            )
            return
        if (num_workers is None) == (num_hosts is None):
            raise exceptions.InvalidArgumentError(
                "give either num_workers or num_hosts (with num_workers_per_host)"
            )
        self.settings = settings
        self.num_hosts = num_hosts
        self.per_bundle = num_workers_per_host if num_hosts else 1
        self.num_workers = num_workers or (num_hosts or 0) * num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.workers: list[Any] = []
        self._pg: Any = None

    def _placement_group(self) -> Any:
        import ray
        from ray.util.placement_group import placement_group

        cpus, gpus = self.cpus_per_worker, self.gpus_per_worker
        bundle = {"CPU": cpus * self.per_bundle}
        if gpus:
            bundle["GPU"] = gpus * self.per_bundle
        count = self.num_hosts or self.num_workers
        pg = placement_group([bundle] * count, strategy="STRICT_SPREAD" if self.num_hosts else "PACK")
        timeout = getattr(self.settings, "placement_group_timeout_s", 100)
        ray.get(pg.ready(), timeout=timeout)
        return pg

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: list[Any] | None = None,
        executable_kwargs: dict[str, Any] | None = None,
        extra_env_vars: dict[str, str] | None = None,
    ) -> None:
        """Starts the workers (one actor each), forms the job's description and hands it to them;
        then creates executable_cls(*executable_args, **executable_kwargs) in every worker."""
        if self._elastic is not None:
            return self._elastic.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._pg = self._placement_group()
        actor = ray.remote(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker)(_Worker)
        workers: list[Any] = [
            actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, i // self.per_bundle)
            ).remote()
            for i in range(self.num_workers)
        ]
        nodes = ray.get([w.node.remote() for w in workers])
        order = sorted(range(len(workers)), key=lambda i: (nodes[i][0] != nodes[0][0], nodes[i][0], i))
        self.workers = [workers[i] for i in order]
        node_ids = [nodes[i][0] for i in order]
        secret = os.urandom(32).hex()
        port = ray.get(self.workers[0].host_store.remote(secret, 2 * len(workers)))
        store_addr = "%s:%d" % (nodes[order[0]][1], port)
        extra = {k: str(v) for k, v in (extra_env_vars or {}).items()}
        extra.setdefault("HVDLITE_START_TIMEOUT", str(getattr(self.settings, "timeout_s", 30)))
        size = len(workers)
        ray.get(
            [
                w.set_env.remote(jobs.Job(rank, size, *topo, store_addr=store_addr, secret=secret), extra)
                for rank, (w, topo) in enumerate(zip(self.workers, _topology(node_ids)))
            ]
        )
        ray.get(
            [
                w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                for w in self.workers
            ]
        )

    def execute(
        self, fn: Callable[[Any], Any], callbacks: list[Callable[..., Any]] | None = None
    ) -> list[Any]:
        """fn(executable) on every worker; the results in rank order."""
        if self._elastic is not None:
            return self._elastic.execute(fn)
        import ray

        return list(ray.get([w.execute.remote(fn) for w in self.workers]))

    def run(
        self,
        fn: Callable[..., Any],
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        callbacks: list[Callable[..., Any]] | None = None,
    ) -> list[Any]:
        """fn(*args, **kwargs) on every worker; the results in rank order."""
        if self._elastic is not None:
            return self._elastic.run(fn, args, kwargs, callbacks)
        import ray

        return list(ray.get(self.run_remote(fn, args, kwargs)))

    def run_remote(
        self, fn: Callable[..., Any], args: list[Any] | None = None, kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        """As run(), without waiting: the ObjectRefs in rank order (ray.get them)."""
        if self._elastic is not None:
            return self._elastic.run_remote(fn, args, kwargs)
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) on rank 0 only."""
        if self._elastic is not None:
            return self._elastic.execute_single(fn)
        import ray

        return ray.get(self.workers[0].execute.remote(fn))

    def shutdown(self) -> None:
        """Ends the workers (the store goes with rank 0's) and frees the placement group."""
        if self._elastic is not None:
            return self._elastic.shutdown()
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None
