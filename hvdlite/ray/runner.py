"""Horovod's horovod.ray.runner: RayExecutor (Horovod 0.28.1's API) over hvdlite. Needs ray
(`pip install hvdlite[ray]`) and ray.init() done by the caller.

How a static job forms (docs/launchers.md, "Ray"): RayExecutor.start() creates its `adapter`, a
StaticAdapter (Horovod's layout), whose strategy (strategy.py; ColocatedStrategy for
num_hosts x num_workers_per_host, PGStrategy for num_workers or inside the caller's current
placement group) reserves the resources and starts one BaseHorovodWorker actor per worker; the
adapter numbers them host-major (the workers of a Ray node get consecutive ranks) and registers
them with a Coordinator, whose local and cross ranks follow Horovod's definitions over Ray's
nodes. The Coordinator draws the secret; the rank-0 actor hosts the store on a free port of its
node's address for the executor's lifetime;
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
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from hvdlite.common import exceptions
from hvdlite.common import job as jobs
from hvdlite.ray.callbacks import CallbackQueue
from hvdlite.ray.elastic import ElasticAdapter
from hvdlite.ray.strategy import BaseStrategy, ColocatedStrategy, PGStrategy

__all__ = ["Coordinator", "MiniSettings", "RayExecutor", "StaticAdapter"]


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


# Horovod's variable of each topology field (HOROVOD_LOCAL_RANK, ...), from the one table of
# identity variables (hvdlite/common/job.py): finalize_registration's keys, as in Horovod.
_HOROVOD = {f: jobs.names(f)[-1] for f in ("local_rank", "local_size", "cross_rank", "cross_size")}


class Coordinator:
    """Horovod's horovod.ray.runner.Coordinator: the registry of which rank runs on which Ray node,
    from which every rank's local and cross topology follows, and the job's rendezvous.

    register(hostname, node_id, world_rank) once per rank; finalize_registration() returns, per
    world rank, Horovod's HOROVOD_LOCAL_RANK / HOROVOD_LOCAL_SIZE / HOROVOD_CROSS_RANK /
    HOROVOD_CROSS_SIZE (local rank: the rank's place among its node's ranks in registration order;
    cross rank: how many nodes registered before its node hold a rank of the same local rank).
    establish_rendezvous() starts the job's store (hvdlite's rendezvous, where Horovod starts its
    Gloo HTTP server) and returns the variables every worker needs to reach it. Driver-side and
    single-threaded, as in Horovod."""

    rendezvous: Any = None
    global_rendezv_port: int | None = None
    nics: Any = None
    store_addr: str | None = None  # set by establish_rendezvous, with the secret (hex)
    secret: str | None = None

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.node_id_by_rank: dict[str, list[int]] = defaultdict(list)
        self._hostnames: set[str] = set()

    @property
    def world_size(self) -> int:
        return sum(len(ranks) for ranks in self.node_id_by_rank.values())

    @property
    def hostnames(self) -> set[str]:
        return self._hostnames

    @property
    def node_id_string(self) -> str:
        """'node:count,...' in registration order (Horovod's host string of the nodes)."""
        return ",".join("%s:%d" % (node, len(ranks)) for node, ranks in self.node_id_by_rank.items())

    def register(self, hostname: str, node_id: str, world_rank: int) -> None:
        self._hostnames.add(hostname)
        self.node_id_by_rank[node_id].append(world_rank)

    def finalize_registration(self) -> dict[int, dict[str, int]]:
        """{world rank: Horovod's local and cross topology variables} (class doc)."""
        cross_sizes: dict[int, int] = defaultdict(int)
        cross_ranks = {}
        for ranks in self.node_id_by_rank.values():
            for local_rank, world_rank in enumerate(ranks):
                cross_ranks[world_rank] = cross_sizes[local_rank]
                cross_sizes[local_rank] += 1
        return {
            world_rank: {
                _HOROVOD["cross_rank"]: cross_ranks[world_rank],
                _HOROVOD["cross_size"]: cross_sizes[local_rank],
                _HOROVOD["local_rank"]: local_rank,
                _HOROVOD["local_size"]: len(ranks),
            }
            for ranks in self.node_id_by_rank.values()
            for local_rank, world_rank in enumerate(ranks)
        }

    def establish_rendezvous(self, host: Any = None) -> dict[str, str]:
        """Starts the job's store for world_size clients under a fresh secret and returns the
        variables every worker needs to reach it (HVDLITE_STORE_ADDR, HVDLITE_SECRET, written by
        hvdlite.common.job.write). `host`: a BaseHorovodWorker actor
        to host it (RayExecutor passes rank 0's, so the store lives and dies with the job's
        actors); None: this process hosts it, as Horovod's driver does, for this object's
        lifetime. Blocks until the store listens (a Ray call, bounded by Ray's actor calls)."""
        import ray

        secret = os.urandom(32).hex()
        clients = 2 * max(1, self.world_size)
        if host is not None:
            address = ray.get(host.node.remote())[1]
            self.global_rendezv_port = int(ray.get(host.host_store.remote(secret, clients)))
        else:
            from hvdlite.common.native import core

            address = str(ray.util.get_node_ip_address())
            self.rendezvous = core.TcpStoreServer("0.0.0.0", 0, bytes.fromhex(secret), clients=clients)
            self.global_rendezv_port = int(self.rendezvous.port)
        self.store_addr, self.secret = "%s:%d" % (address, self.global_rendezv_port), secret
        return dict(jobs.write({}, jobs.Job(store_addr=self.store_addr, secret=secret)))


class StaticAdapter:
    """Horovod's horovod.ray.runner.StaticAdapter: the static form of RayExecutor, which
    RayExecutor.start() creates as its `adapter` (module doc). `strategy` is the placement
    strategy once started, `workers` the actors in rank order, `coordinator` the Coordinator
    that numbered them."""

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
    ) -> None:
        self.settings = settings
        self.num_hosts, self.num_workers_per_host = num_hosts, num_workers_per_host
        self.num_workers = num_workers or (num_hosts or 0) * num_workers_per_host
        self.cpus_per_worker, self.use_gpu, self.gpus_per_worker = cpus_per_worker, use_gpu, gpus_per_worker
        self.use_current_placement_group = use_current_placement_group
        self.workers: list[Any] = []
        self.strategy: BaseStrategy | None = None
        self.coordinator: Coordinator | None = None

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
        """Starts the workers (one actor each), numbers them host-major through the Coordinator,
        hands each its job description; then creates executable_cls(*executable_args,
        **executable_kwargs) in every worker. Blocks until every worker has its executable."""
        import ray

        self.strategy = self._create_strategy()
        workers, _ = self.strategy.create_workers()
        nodes = ray.get([w.node.remote() for w in workers])
        hostnames = ray.get([w.hostname.remote() for w in workers])
        order = sorted(range(len(workers)), key=lambda i: (nodes[i][0] != nodes[0][0], nodes[i][0], i))
        self.workers = [workers[i] for i in order]
        self.coordinator = Coordinator(self.settings)
        for rank, i in enumerate(order):
            self.coordinator.register(hostnames[i], nodes[i][0], rank)
        topology = self.coordinator.finalize_registration()
        self.coordinator.establish_rendezvous(host=self.workers[0])
        extra = {k: str(v) for k, v in (extra_env_vars or {}).items()}
        extra.setdefault("HVDLITE_START_TIMEOUT", str(getattr(self.settings, "timeout_s", 30)))
        size = len(workers)
        job = jobs.Job(size=size, store_addr=self.coordinator.store_addr, secret=self.coordinator.secret)
        jobs_ = []
        for rank in range(size):
            topo = {f: topology[rank][name] for f, name in _HOROVOD.items()}
            jobs_.append(
                job._replace(
                    rank=rank,
                    local_rank=topo["local_rank"],
                    local_size=topo["local_size"],
                    cross_rank=topo["cross_rank"],
                    cross_size=topo["cross_size"],
                )
            )
        ray.get([w.set_env.remote(job, extra) for w, job in zip(self.workers, jobs_)])
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
        return self._call_all(fn, callbacks)

    def run(
        self,
        fn: Callable[..., Any],
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        callbacks: list[Callable[..., Any]] | None = None,
    ) -> list[Any]:
        a, kw = list(args or ()), dict(kwargs or {})
        return self._call_all(lambda _: fn(*a, **kw), callbacks)

    def run_remote(
        self, fn: Callable[..., Any], args: list[Any] | None = None, kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        import ray

        return ray.get(self.workers[0].execute.remote(fn))

    def shutdown(self) -> None:
        """Ends the workers (the store goes with rank 0's) and frees what the strategy reserved."""
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self.strategy is not None:
            self.strategy.shutdown()


class RayExecutor:
    """Horovod's horovod.ray.RayExecutor over hvdlite (module doc). As in Horovod, every call
    goes to `adapter`: a StaticAdapter that start() creates (with its `strategy`), or with
    min_workers the ElasticAdapter, created with the executor; shutdown() drops it."""

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
        if max_workers is not None and not min_workers:
            raise exceptions.InvalidArgumentError("max_workers needs a positive min_workers (elastic jobs)")
        self.settings = settings
        self.adapter: Any = None
        if min_workers is not None:
            if num_workers is not None or num_hosts is not None:
                raise exceptions.InvalidArgumentError(
                    "give either min_workers (elastic) or num_workers/num_hosts (static), not both"
                )
            # The elastic adapter exists from here on (its calls check their arguments before
            # start(), and start() only records what the workers of each generation create).
            elastic = (
                min_workers,
                max_workers,
                use_gpu,
                cpus_per_worker,
                gpus_per_worker,
                override_discovery,
            )
            self.adapter = ElasticAdapter(settings, *elastic, reset_limit, cooldown_range, elastic_timeout)
            self._make_adapter: Callable[[], Any] | None = None
            return
        if (num_workers is None) == (num_hosts is None):
            raise exceptions.InvalidArgumentError(
                "give either num_workers or num_hosts (with num_workers_per_host)"
            )
        static = (num_workers, num_hosts, num_workers_per_host, cpus_per_worker, use_gpu, gpus_per_worker)
        self._make_adapter = lambda: StaticAdapter(settings, *static, use_current_placement_group)

    @property
    def strategy(self) -> BaseStrategy | None:
        """The static form's placement strategy (adapter.strategy) once started."""
        return getattr(self.adapter, "strategy", None)

    @property
    def workers(self) -> list[Any]:
        """The static form's worker actors in rank order once started."""
        return list(getattr(self.adapter, "workers", None) or [])

    def _started(self, what: str) -> Any:
        if self.adapter is None:
            raise exceptions.PreconditionError("RayExecutor.%s: call start() first" % what)
        return self.adapter

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: list[Any] | None = None,
        executable_kwargs: dict[str, Any] | None = None,
        extra_env_vars: dict[str, str] | None = None,
    ) -> None:
        """Creates the adapter and starts the workers (StaticAdapter.start, or the elastic job);
        blocks until every worker has its executable."""
        if self._make_adapter is not None:
            self.adapter = self._make_adapter()
        self._started("start").start(executable_cls, executable_args, executable_kwargs, extra_env_vars)

    def execute(
        self, fn: Callable[[Any], Any], callbacks: list[Callable[..., Any]] | None = None
    ) -> list[Any]:
        """fn(executable) on every worker; the results in rank order. Each callback is called
        with every value the workers log (ray_logger.log) meanwhile."""
        return list(self._started("execute").execute(fn, callbacks))

    def run(
        self,
        fn: Callable[..., Any],
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        callbacks: list[Callable[..., Any]] | None = None,
    ) -> list[Any]:
        """`fn(*args, **kwargs)` on every worker; the results in rank order. Each callback is
        called with every value the workers log (ray_logger.log) meanwhile."""
        return list(self._started("run").run(fn, args, kwargs, callbacks))

    def run_remote(
        self, fn: Callable[..., Any], args: list[Any] | None = None, kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        """As run(), without waiting: the ObjectRefs in rank order (ray.get them)."""
        return list(self._started("run_remote").run_remote(fn, args, kwargs))

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) on rank 0 only."""
        return self._started("execute_single").execute_single(fn)

    def shutdown(self) -> None:
        """Ends the workers and frees what the strategy reserved; drops the adapter."""
        if self.adapter is None:
            return
        try:
            self.adapter.shutdown()
        finally:
            self.adapter = None
