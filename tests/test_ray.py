"""hvdlite.ray.RayExecutor on a real local multi-node Ray cluster (ray.cluster_utils.Cluster: a
head and a second raylet, 2 CPUs each). Skipped where ray is not installed."""

import json
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parent.parent


def _allreduce(scale):
    import numpy as np

    import hvdlite as hvd

    hvd.init()
    out = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum, name="ray")
    node = ray.get_runtime_context().get_node_id()
    topo = [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]
    return topo + [float(out[0]) * scale, node, os.environ.get("FROM_DRIVER")]


class _Model:
    def __init__(self, base):
        self.base = base

    def step(self):
        import numpy as np

        import hvdlite as hvd

        hvd.init()
        return float(hvd.allreduce(np.array([self.base + hvd.rank()]), op=hvd.Sum, name="model")[0])


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    store = 80 * 2**20
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False, "object_store_memory": store},
    )
    c.add_node(num_cpus=2, object_store_memory=store)
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}
    ray.init(address=c.address, runtime_env={"env_vars": env})
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.mark.slow
def test_static_run_across_two_ray_nodes(cluster):
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2, num_workers_per_host=2)
    executor.start(extra_env_vars={"FROM_DRIVER": "yes"})
    try:
        got = executor.run(_allreduce, args=[2.0])
        refs = executor.run_remote(_allreduce, args=[1.0])
        again = ray.get(refs)
    finally:
        executor.shutdown()
    assert [g[:6] for g in got] == [
        [0, 4, 0, 2, 0, 2],
        [1, 4, 1, 2, 0, 2],
        [2, 4, 0, 2, 1, 2],
        [3, 4, 1, 2, 1, 2],
    ]
    assert all(g[6] == 20.0 and g[8] == "yes" for g in got)
    assert got[0][7] == got[1][7] != got[2][7] == got[3][7]  # two ranks on each Ray node
    assert [a[6] for a in again] == [10.0] * 4


@pytest.mark.slow
def test_executable_class_execute_and_execute_single(cluster):
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    executor.start(executable_cls=_Model, executable_args=[10.0])
    try:
        assert executor.execute(lambda model: model.step()) == [21.0, 21.0]
        assert executor.execute_single(lambda model: model.base) == 10.0
    finally:
        executor.shutdown()


def _log_steps(steps):
    """Each rank logs (rank, step) for each step through Horovod's ray_logger."""
    import hvdlite as hvd
    from hvdlite.ray import ray_logger

    hvd.init()
    for step in range(steps):
        ray_logger.log({"rank": hvd.rank(), "step": step})
    return hvd.rank()


@pytest.mark.slow
def test_callbacks_get_every_value_the_workers_log(cluster):
    """run() and execute() pass each value a worker logs to every callback, each worker's in
    the order logged, all of them before the call returns; a callback's exception reaches the
    caller; without callbacks log() only warns."""
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    executor.start(executable_cls=_Model, executable_args=[10.0])
    seen, doubled = [], []
    try:
        assert executor.run(_log_steps, args=[3], callbacks=[seen.append, lambda v: doubled.append(v)]) == [
            0,
            1,
        ]

        def log_base(model):
            from hvdlite.ray import ray_logger

            ray_logger.log(model.base)
            return model.base

        on_execute = []
        assert executor.execute(log_base, callbacks=[on_execute.append]) == [10.0, 10.0]

        def broken(value):
            raise KeyError("callback failed")

        with pytest.raises(KeyError, match="callback failed"):
            executor.run(_log_steps, args=[1], callbacks=[broken])
        assert executor.run(_log_steps, args=[1]) == [0, 1]  # no queue: log() warns, run() goes on
    finally:
        executor.shutdown()
    assert sorted((v["rank"], v["step"]) for v in seen) == [(r, s) for r in range(2) for s in range(3)]
    for rank in range(2):
        assert [v["step"] for v in seen if v["rank"] == rank] == [0, 1, 2]
    assert doubled == seen
    assert on_execute == [10.0, 10.0]


def _inside_a_placement_group():
    """Runs in a Ray task inside the caller's placement group (as a Ray Tune trial does): the
    executor's workers go into that group, and shutdown leaves the group to its owner."""
    from ray.util.placement_group import get_current_placement_group

    from hvdlite.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    executor.start()
    try:
        got = executor.run(_allreduce, args=[1.0])
        inherited = executor.strategy.placement_group.id == get_current_placement_group().id
    finally:
        executor.shutdown()
    return [g[6] for g in got], inherited


@pytest.mark.slow
def test_workers_go_into_the_current_placement_group(cluster):
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    try:
        task = ray.remote(num_cpus=0)(_inside_a_placement_group).options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        )
        assert ray.get(task.remote(), timeout=120) == ([3.0, 3.0], True)
        assert placement_group_table(pg)["state"] == "CREATED"  # not removed by the executor
    finally:
        remove_placement_group(pg)


def test_static_form_needs_num_workers_or_num_hosts():
    from hvdlite.ray import RayExecutor

    with pytest.raises(ValueError, match="num_workers or num_hosts"):
        RayExecutor(RayExecutor.create_settings())


def _ray_train_loop(config):
    import numpy as np
    import ray.train

    import hvdlite as hvd
    from hvdlite.common.objects import allgather_object

    hvd.init()
    total = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum, name="train")
    context = ray.train.get_context()
    mine = [context.get_world_rank(), hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_size()]
    rows = allgather_object(mine + [float(total[0]) * config["scale"]])
    if hvd.rank() == 0:  # Ray Train v2 keeps reported metrics only with a checkpoint
        with open(config["out"], "w") as f:
            json.dump(rows, f)


@pytest.mark.slow
def test_ray_train_data_parallel_trainer_with_the_hvdlite_backend(cluster, tmp_path):
    """Ray Train (v2, this Ray's default) runs a loop that calls hvd.init() and an allreduce,
    the backend being hvdlite's: hvdlite's ranks are Ray Train's world ranks."""
    try:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    except ImportError as e:
        pytest.skip("Ray Train needs ray[train] (pip install hvdlite[ray]): %s" % e)

    from hvdlite.ray.train import HvdliteConfig

    trainer = DataParallelTrainer(
        _ray_train_loop,
        train_loop_config={"scale": 2.0, "out": str(tmp_path / "rows.json")},
        backend_config=HvdliteConfig(timeout_s=60),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="hvdlite_backend"),
    )
    trainer.fit()
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r[:3] for r in rows] == [[0, 0, 2], [1, 1, 2]]
    assert [r[5] for r in rows] == [6.0, 6.0]
