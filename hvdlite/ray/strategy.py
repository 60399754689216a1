"""Horovod's horovod.ray.strategy: where a static RayExecutor's workers go.

ColocatedStrategy (RayExecutor(num_hosts=H, num_workers_per_host=W)) reserves H bundles of W
workers' resources, STRICT_SPREAD (one bundle per Ray node), and starts W workers in each.
PGStrategy (RayExecutor(num_workers=N)) reserves N one-worker bundles, PACK, and starts one worker
in each; or, given a placement group (the caller's current one, as inside a Ray Tune trial),
starts the N workers in it without reserving anything. create_workers() blocks until the group is
ready (settings.placement_group_timeout_s, then HvdliteTimeoutError naming what was asked and what
is free) and returns (workers in bundle order, one worker per hostname). With use_gpu every worker
of a node sees all the node's workers' GPUs (CUDA_VISIBLE_DEVICES), as in Horovod, so CUDA can use
peer access between them. shutdown() frees a group the strategy reserved, never the caller's.
"""

from collections.abc import Callable
from typing import Any

from hvdlite.common import exceptions
from hvdlite.ray.worker import BaseHorovodWorker


def create_placement_group(
    resources_per_bundle: dict[str, float], num_bundles: int, pg_timeout: float, pg_strategy: str
) -> tuple[Any, list[dict[str, float]]]:
    """A ready placement group of num_bundles copies of resources_per_bundle, and the bundles."""
    import ray

    bundles = [dict(resources_per_bundle) for _ in range(num_bundles)]
    pg = ray.util.placement_group(bundles, strategy=pg_strategy)
    ready, _ = ray.wait([pg.ready()], timeout=pg_timeout)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise exceptions.HvdliteTimeoutError(
            "Ray placement group (%d x %s, %s) not ready after %ss: the cluster has %s free; add "
            "nodes, ask for fewer workers, or raise placement_group_timeout_s"
            % (num_bundles, resources_per_bundle, pg_strategy, pg_timeout, ray.available_resources())
        )
    return pg, bundles


def _share_node_gpus(workers: list[Any]) -> None:
    """Sets CUDA_VISIBLE_DEVICES of each worker to the GPU ids of all workers on its node."""
    import ray

    nodes = ray.get([w.node_id.remote() for w in workers])
    gpus = ray.get([w.get_gpu_ids.remote() for w in workers])
    by_node: dict[str, list[int]] = {}
    for node, ids in zip(nodes, gpus):
        by_node.setdefault(node, []).extend(ids)
    ray.get(
        [
            w.update_env_vars.remote({"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in by_node[node])})
            for w, node in zip(workers, nodes)
        ]
    )


class BaseStrategy:
    """What a placement strategy provides (module doc)."""

    placement_group: Any = None
    workers: list[Any] | None = None
    use_gpu = False
    cpus_per_worker = 1
    gpus_per_worker = 1

    def create_workers(self) -> tuple[list[Any], list[Any]]:
        raise exceptions.NotSupportedError("%s does not define create_workers" % type(self).__name__)

    @property
    def num_workers(self) -> int:
        raise exceptions.NotSupportedError("%s does not define num_workers" % type(self).__name__)

    @classmethod
    def get_node_workers(cls, workers: list[Any]) -> list[Any]:
        """One worker per hostname (the last of each)."""
        import ray

        hostnames = ray.get([w.hostname.remote() for w in workers])
        return list(dict(zip(hostnames, workers)).values())

    def _start_worker(self, bundle_index: int, world_rank: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor: Callable[..., Any] = ray.remote(BaseHorovodWorker)
        return actor.options(  # type: ignore[attr-defined]
            num_cpus=self.cpus_per_worker,
            num_gpus=self.gpus_per_worker * int(self.use_gpu),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, bundle_index, placement_group_capture_child_tasks=False
            ),
        ).remote(world_rank=world_rank, world_size=self.num_workers)

    def _finish(self, workers: list[Any]) -> tuple[list[Any], list[Any]]:
        self.workers = workers
        if self.use_gpu:
            _share_node_gpus(workers)
        return workers, self.get_node_workers(workers)

    def shutdown(self) -> None:
        import ray

        if self.placement_group is not None:
            ray.util.remove_placement_group(self.placement_group)
        self.workers = []
        self.placement_group = None


class ColocatedStrategy(BaseStrategy):
    """num_workers_per_host workers on each of num_hosts Ray nodes (module doc)."""

    def __init__(
        self,
        *,
        settings: Any,
        num_hosts: int,
        num_workers_per_host: int,
        use_gpu: bool,
        cpus_per_worker: int,
        gpus_per_worker: int | None,
    ) -> None:
        self.settings, self.num_hosts, self.num_workers_per_host = settings, num_hosts, num_workers_per_host
        self.use_gpu, self.cpus_per_worker = use_gpu, cpus_per_worker
        self.gpus_per_worker = gpus_per_worker or 1

    @property
    def num_workers(self) -> int:
        return int(self.num_hosts * self.num_workers_per_host)

    def _resources_per_host(self) -> dict[str, float]:
        per_host: dict[str, float] = {"CPU": self.cpus_per_worker * self.num_workers_per_host}
        if self.use_gpu:
            per_host["GPU"] = self.gpus_per_worker * self.num_workers_per_host
        return per_host

    def create_workers(self) -> tuple[list[Any], list[Any]]:
        self.placement_group, bundles = create_placement_group(
            self._resources_per_host(),
            self.num_hosts,
            getattr(self.settings, "placement_group_timeout_s", 100),
            "STRICT_SPREAD",
        )
        per = self.num_workers_per_host
        return self._finish(
            [self._start_worker(b, per * b + i) for b in range(len(bundles)) for i in range(per)]
        )


class PGStrategy(BaseStrategy):
    """num_workers workers packed into a placement group: a new one, or the given/current one
    (module doc)."""

    def __init__(
        self,
        *,
        settings: Any,
        num_workers: int,
        use_gpu: bool,
        cpus_per_worker: int,
        gpus_per_worker: int | None,
        placement_group: Any = None,
        force_create_placement_group: bool = False,
    ) -> None:
        from ray.util.placement_group import get_current_placement_group

        self.settings, self._num_workers = settings, num_workers
        self.use_gpu, self.cpus_per_worker = use_gpu, cpus_per_worker
        self.gpus_per_worker = gpus_per_worker or 1
        if not force_create_placement_group:
            self.placement_group = placement_group or get_current_placement_group()
        self._created_placement_group = False

    @property
    def num_workers(self) -> int:
        return int(self._num_workers)

    def resources_per_worker(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker * int(self.use_gpu)}

    def create_workers(self) -> tuple[list[Any], list[Any]]:
        if self.placement_group is None:
            resources = {k: v for k, v in self.resources_per_worker().items() if v}
            self.placement_group, _ = create_placement_group(
                resources,
                self.num_workers,
                getattr(self.settings, "placement_group_timeout_s", 100),
                "PACK",
            )
            self._created_placement_group = True
        own = self._created_placement_group
        return self._finish([self._start_worker(i if own else -1, i) for i in range(self.num_workers)])

    def shutdown(self) -> None:
        if not self._created_placement_group:
            self.placement_group = None  # the caller's: not ours to free
        super().shutdown()
        self._created_placement_group = False
