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
        # Horovod's layout: the executor's adapter holds the strategy (here one that reserved a
        # placement group of its own) and the Coordinator that numbered the workers.
        assert type(executor.adapter).__name__ == "StaticAdapter"
        assert type(executor.adapter.strategy).__name__ == "ColocatedStrategy"
        assert (
            executor.adapter.coordinator.world_size == 4 and len(executor.adapter.coordinator.hostnames) == 1
        )
        assert (
            executor.adapter.coordinator.node_id_string.endswith(":2")
            and executor.adapter.strategy.placement_group
        )
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
        assert executor.adapter.strategy._created_placement_group  # PGStrategy reserved its own
    finally:
        executor.shutdown()
    assert executor.adapter is None  # shutdown drops the adapter, as Horovod's deletes it


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
        # Horovod's own check (test_horovod_train_in_pg): the strategy made no group of its own.
        inherited = inherited and not executor.adapter.strategy._created_placement_group
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


def test_coordinator_numbers_ranks_as_horovods():
    """Horovod's Coordinator semantics: local rank = place among the node's ranks in registration
    order, cross rank = how many earlier nodes hold that local rank; uneven nodes."""
    from hvdlite.ray.runner import Coordinator, MiniSettings

    coord = Coordinator(MiniSettings())
    assert coord.world_size == 0 and coord.node_id_string == "" and coord.finalize_registration() == {}
    for rank, node in enumerate(["a", "b", "a", "c", "a", "b"]):
        coord.register("host-" + node, node_id=node, world_rank=rank)
    assert coord.world_size == 6 and coord.node_id_string == "a:3,b:2,c:1"
    assert coord.hostnames == {"host-a", "host-b", "host-c"}
    got = coord.finalize_registration()
    keys = ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")
    assert {r: tuple(got[r][k] for k in keys) for r in got} == {
        0: (0, 3, 0, 3),
        2: (1, 3, 0, 2),
        4: (2, 3, 0, 1),
        1: (0, 2, 1, 3),
        5: (1, 2, 1, 2),
        3: (0, 1, 2, 3),
    }


def test_coordinator_rendezvous_hosted_by_the_driver():
    """establish_rendezvous() without a host starts the job's store in this process, as Horovod's
    driver does; the returned variables are what a worker needs to be admitted."""
    from test_store import GET, SET, admitted, call

    from hvdlite.ray.runner import Coordinator, MiniSettings

    coord = Coordinator(MiniSettings())
    coord.register("h", node_id="n", world_rank=0)
    env = coord.establish_rendezvous()
    try:
        host, port = env["HVDLITE_STORE_ADDR"].rsplit(":", 1)
        assert host == ray.util.get_node_ip_address() and int(port) == coord.global_rendezv_port
        sock = admitted(int(port), bytes.fromhex(env["HVDLITE_SECRET"]))
        assert call(sock, SET, b"k", b"v")[0] == 0 and call(sock, GET, b"k") == (0, b"v")
        sock.close()
    finally:
        coord.rendezvous.stop()


# Test-environment shim for Horovod's test file, not for hvdlite: Ray since 2.x rejects the
# ray.init(_redis_max_memory=...) that Horovod 0.28.1's fixtures pass; this pytest plugin drops
# that one argument.
_RAY_INIT_SHIM = """
import ray

_init = ray.init


def init(*args, **kwargs):
    kwargs.pop("_redis_max_memory", None)
    return _init(*args, **kwargs)


ray.init = init
"""


def _horovods_test_ray(tmp_path, select):
    """Runs Horovod 0.28.1's test/single/test_ray.py, unchanged, with pytest -k `select` in a
    fresh process that imports horovod.ray through the compat package; returns pytest's -rA
    report. Skips without Horovod's sources (tests/horovod_suite.py)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    import horovod_suite

    pytest.importorskip("torch")
    if horovod_suite.available():
        pytest.skip(horovod_suite.available())
    kind, path = horovod_suite.source()
    for name in ["test/single/test_ray.py"] + horovod_suite.HELPERS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(horovod_suite._read(kind, path, horovod_suite.REF, name))
    here = tmp_path / "test" / "single"
    (here / "ray_init_shim.py").write_text(_RAY_INIT_SHIM)
    paths = [str(REPO), str(REPO / "compat" / "src"), str(here)]
    # Its own Ray temp root: ray.init() would otherwise join the cluster this module's fixture
    # runs (Ray finds it through its temp root), and Horovod's fixtures start their own. Short,
    # for Ray's socket paths.
    ray_tmp = tempfile.mkdtemp(prefix="hvr", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1", RAY_TMPDIR=ray_tmp)
    argv = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "ray_init_shim"]
    try:
        run = subprocess.run(
            argv + ["test_ray.py", "-k", select],
            cwd=here,
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


def test_horovods_own_coordinator_tests_pass(tmp_path):
    """Horovod's tests that need no Ray cluster: Coordinator registration and cross ranks."""
    report = _horovods_test_ray(tmp_path, "coordinator or cross_rank")
    assert "3 passed" in report, report[-3000:]


@pytest.mark.slow
def test_horovods_own_ray_tests_pass(tmp_path):
    """All of Horovod's test_ray.py (local Ray instances of 2 to 6 CPUs that each test starts):
    the executor's forms, executables, training, a job inside a placement group (its
    `adapter.strategy`), Ray client, and infeasible placements raising TimeoutError. Only its
    GPU tests skip where there is no GPU."""
    report = _horovods_test_ray(tmp_path, "test_")
    passed = {line.split("::")[1] for line in report.splitlines() if line.startswith("PASSED ")}
    for name in ("test_horovod_train_in_pg", "test_remote_client_train", "test_horovod_mixin"):
        assert name in passed, report[-3000:]
    assert {p.split("[")[0] for p in passed} >= {"test_infeasible_placement", "test_horovod_train"}
    assert "FAILED" not in report and "ERROR" not in report, report[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("num_workers,num_hosts,per_host", [(9, None, 1), (None, 1, 9)])
def test_infeasible_placement_is_pythons_timeout_error(cluster, num_workers, num_hosts, per_host):
    """Horovod's semantics (its test_infeasible_placement): more workers than the cluster's CPUs
    end start() with Python's TimeoutError after placement_group_timeout_s, naming what is free;
    shutdown() after it is fine."""
    from hvdlite.common.exceptions import HvdliteTimeoutError
    from hvdlite.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=2)
    executor = RayExecutor(
        settings, num_workers=num_workers, num_hosts=num_hosts, num_workers_per_host=per_host
    )
    with pytest.raises(TimeoutError, match="placement_group_timeout_s") as info:
        executor.start()
    assert isinstance(info.value, HvdliteTimeoutError) and "free" in str(info.value)
    executor.shutdown()


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
