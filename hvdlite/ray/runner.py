"""Horovod's horovod.ray.runner: RayExecutor (Horovod 0.28.1's API) over hvdlite. Needs ray
(`pip install hvdlite[ray]`) and ray.init() done by the caller.

How a static job forms (docs/launchers.md, "Ray"): a strategy (strategy.py; ColocatedStrategy for
num_hosts x num_workers_per_host, PGStrategy for num_workers or inside the caller's current
placement group) reserves the resources and starts one BaseHorovodWorker actor per worker; the
executor numbers them host-major (the workers of a Ray node get consecutive ranks; local and
cross ranks follow Horovod's definitions over Ray's nodes). The driver draws the secret; the
rank-0 actor hosts the store on a free port of its node's address for the executor's lifetime;
every actor gets the job description in its environment through hvdlite.common.job.write, so the
function it runs calls hvd.init() as under hvdliterun. Ray schedules and places everything;
hvdlite starts no process of its own.

`callbacks` (run, execute): every value a worker passes to hvdlite.ray.ray_logger.log (Horovod's
horovod.ray.ray_logger) is passed to every callback in the driver while the call runs
(callbacks.py). Horovod 0.28.1 documents this for both forms but its static executor drops the
callbacks; hvdlite calls them in both.

With min_workers (and max_workers) the executor is elastic: every call goes to
hvdlite.ray.elastic.ElasticAdapter (Horovod's elastic_v2), which runs hvdlite's elastic driver
with Ray actors as workers.
"""

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from hvdlite.common import exceptions
from hvdlite.common import job as jobs
from hvdlite.ray.callbacks import CallbackQueue
from hvdlite.ray.elastic import ElasticAdapter
from hvdlite.ray.strategy import BaseStrategy, ColocatedStrategy, PGStrategy

__all__ = ["MiniSettings", "RayExecutor"]


@dataclasses.dataclass
class MiniSettings:
    """Horovod's RayExecutor settings; mutable, as Horovod's (scripts set fields such as
    `discovery`, which the elastic form reads with override_discovery=False)."""

    ssh_identity_file: str | None = None
    timeout_s: int = 30
    placement_group_timeout_s: int = 100
    nics: Any = None
    elastic: bool = False
    verbose: int = 1
    discovery: Any = None


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
        self.num_hosts, self.num_workers_per_host = num_hosts, num_workers_per_host
        self.num_workers = num_workers or (num_hosts or 0) * num_workers_per_host
        self.cpus_per_worker, self.use_gpu, self.gpus_per_worker = cpus_per_worker, use_gpu, gpus_per_worker
        self.use_current_placement_group = use_current_placement_group
        self.workers: list[Any] = []
        self.strategy: BaseStrategy | None = None

    def _create_strategy(self) -> BaseStrategy:
        """Horovod's choice: PGStrategy for num_workers or inside a current placement group (when
        use_current_placement_group), else ColocatedStrategy."""
        from ray.util.placement_group import get_current_placement_group

        inherit = self.use_current_placement_group and get_current_placement_group() is not None
        if self.num_hosts is None or inherit:
            return PGStrategy(
                settings=self.settings,
                num_workers=self.num_workers,
                use_gpu=self.use_gpu,
                cpus_per_worker=self.cpus_per_worker,
                gpus_per_worker=self.gpus_per_worker,
                force_create_placement_group=not self.use_current_placement_group,
            )
        return ColocatedStrategy(
            settings=self.settings,
            num_hosts=self.num_hosts,
            num_workers_per_host=self.num_workers_per_host,
            use_gpu=self.use_gpu,
            cpus_per_worker=self.cpus_per_worker,
            gpus_per_worker=self.gpus_per_worker,
        )

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: list[Any] | None = None,
        executable_kwargs: dict[str, Any] | None = None,
        extra_env_vars: dict[str, str] | None = None,
    ) -> None:
        """Starts the workers (one actor each), forms the job's description and hands it to them;
        then creates `executable_cls(*executable_args, **executable_kwargs)` in every worker.
        Blocks until every worker has its executable."""
        if self._elastic is not None:
            return self._elastic.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)
        import ray

        self.strategy = self._create_strategy()
        workers, _ = self.strategy.create_workers()
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

    def _call_all(self, fn: Callable[[Any], Any], callbacks: list[Callable[..., Any]] | None) -> list[Any]:
        """fn(executable) on every worker with the callbacks' queue set; values in rank order."""
        import ray

        with CallbackQueue(callbacks) as calls:
            if calls.queue is not None:
                ray.get([w.set_queue.remote(calls.queue) for w in self.workers])
            try:
                return list(ray.get([w.execute.remote(fn) for w in self.workers]))
            finally:
                if calls.queue is not None:
                    ray.get([w.set_queue.remote(None) for w in self.workers])

    def execute(
        self, fn: Callable[[Any], Any], callbacks: list[Callable[..., Any]] | None = None
    ) -> list[Any]:
        """fn(executable) on every worker; the results in rank order. Each callback is called
        with every value the workers log (ray_logger.log) meanwhile."""
        if self._elastic is not None:
            return self._elastic.execute(fn, callbacks)
        return self._call_all(fn, callbacks)

    def run(
        self,
        fn: Callable[..., Any],
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        callbacks: list[Callable[..., Any]] | None = None,
    ) -> list[Any]:
        """`fn(*args, **kwargs)` on every worker; the results in rank order. Each callback is
        called with every value the workers log (ray_logger.log) meanwhile."""
        if self._elastic is not None:
            return self._elastic.run(fn, args, kwargs, callbacks)
        a, kw = list(args or ()), dict(kwargs or {})
        return self._call_all(lambda _: fn(*a, **kw), callbacks)

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
        """Ends the workers (the store goes with rank 0's) and frees what the strategy reserved."""
        if self._elastic is not None:
            return self._elastic.shutdown()
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self.strategy is not None:
            self.strategy.shutdown()
            self.strategy = None
