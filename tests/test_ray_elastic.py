"""Elastic hvdlite on a real local multi-node Ray cluster (ray.cluster_utils.Cluster: a head and
two more raylets, one CPU each, so one worker per Ray node): a Ray node removed mid-training, the
survivors re-form and go on, no committed step is lost, and the result is what the survivors
computed. Skipped where ray is not installed."""

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parent.parent
STEPS = 30


def _grad(step, rank):
    return np.full(4, (step + 1) * 0.01 + rank)


def _train(progress, steps, pause):
    """An elastic loop: each committed step appends (step, size) to state.log; rank 0 appends
    "step size node time" to the file `progress` after each commit."""
    import hvdlite as hvd
    from hvdlite.common.objects import allgather_object

    hvd.init()
    state = hvd.elastic.ObjectState(step=0, w=np.zeros(4), log=[])
    node = ray.get_runtime_context().get_node_id()

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            update = hvd.allreduce(_grad(state.step, hvd.rank()), op=hvd.Average, name="grad")
            nodes = allgather_object(node)
            state.w = state.w - 0.1 * update
            state.log.append((state.step, hvd.size()))
            state.step += 1
            time.sleep(pause)
            state.commit()
            if hvd.rank() == 0:
                with open(progress, "a") as f:
                    f.write(json.dumps([state.step - 1, hvd.size(), nodes, time.time()]) + "\n")
        return state.w

    w = train(state)
    return hvd.rank(), hvd.size(), state.log, w.tolist()


def _expected(log):
    """The weights the logged steps give: each step's update is the mean of the gradients of
    the ranks that took it."""
    w = np.zeros(4)
    for step, size in log:
        w = w - 0.1 * np.mean([_grad(step, r) for r in range(size)], axis=0)
    return w


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    store = 80 * 2**20
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": store},
    )
    nodes = [c.add_node(num_cpus=1, object_store_memory=store) for _ in range(2)]
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}
    ray.init(address=c.address, runtime_env={"env_vars": env})
    c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def _progress(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _remove_a_worker_node(c, nodes, path, at_step, seen):
    """Waits until rank 0 committed `at_step`, then removes a Ray node (not the head) that holds
    a rank other than 0; records the node and the time in `seen`."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = _progress(path)
        if rows and rows[-1][0] >= at_step:
            ranks_nodes = rows[-1][2]
            victim = next(n for n in nodes if n.node_id in ranks_nodes[1:] and n.node_id != ranks_nodes[0])
            seen.update(node=victim.node_id, step=rows[-1][0], t=time.time())
            c.remove_node(victim)
            return
        time.sleep(0.05)


def _sum_of_ranks(scale):
    import hvdlite as hvd

    hvd.init()
    total = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum, name="sum")
    return hvd.rank(), hvd.size(), float(total[0]) * scale, os.environ.get("FROM_DRIVER")


@pytest.mark.slow
def test_elastic_ray_executor_v2_form_uses_every_node(cluster):
    """RayExecutor(min_workers=..., max_workers=...) (Horovod's elastic_v2): one worker per
    one-CPU Ray node, values in rank order."""
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(), min_workers=2, max_workers=3, cpus_per_worker=1)
    executor.start(extra_env_vars={"FROM_DRIVER": "yes"})
    try:
        got = executor.run(_sum_of_ranks, args=[2.0])
    finally:
        executor.shutdown()
    assert got == [(r, 3, 12.0, "yes") for r in range(3)]


class _Replica:
    """An executable class: its constructor joins the job (each elastic worker makes its own)."""

    def __init__(self, base):
        import hvdlite as hvd

        hvd.init()
        self.base = base

    def step(self):
        import hvdlite as hvd
        from hvdlite.ray import ray_logger

        total = float(hvd.allreduce(np.array([self.base + hvd.rank()]), op=hvd.Sum, name="replica")[0])
        ray_logger.log({"rank": hvd.rank(), "total": total})
        return total


@pytest.mark.slow
def test_elastic_execute_with_an_executable_class_and_callbacks(cluster):
    """The elastic RayExecutor (Horovod's elastic_v2) creates start()'s executable class in every
    worker and execute(fn) calls fn on it; what the workers log reaches the callbacks."""
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(), min_workers=2, max_workers=2)
    executor.start(executable_cls=_Replica, executable_args=[5.0])
    seen = []
    try:
        got = executor.execute(_Replica.step, callbacks=[seen.append])
    finally:
        executor.shutdown()
    assert got == [11.0, 11.0]
    assert sorted(v["rank"] for v in seen) == [0, 1] and {v["total"] for v in seen} == {11.0}


def _log_rank():
    import hvdlite as hvd
    from hvdlite.ray import ray_logger

    hvd.init()
    ray_logger.log(("rank", hvd.rank()))
    return hvd.rank()


@pytest.mark.slow
def test_elastic_ray_executor_calls_the_callbacks(cluster):
    """Horovod's older elastic API: run(worker_fn, callbacks) passes what the workers log to each
    callback."""
    from hvdlite.ray import ElasticRayExecutor

    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2))
    executor.start()
    seen, also = [], []
    assert executor.run(_log_rank, callbacks=[seen.append, also.append]) == [0, 1]
    assert sorted(seen) == [("rank", 0), ("rank", 1)] and also == seen


class _AddressDiscovery:
    """A discovery written for Horovod: only find_available_hosts_and_slots, hosts named by node
    address (all raylets of this test cluster share one)."""

    def find_available_hosts_and_slots(self):
        return {ray.util.get_node_ip_address(): 2}


@pytest.mark.slow
def test_a_horovod_style_discovery_set_on_the_settings_is_used(cluster):
    from hvdlite.ray import ElasticRayExecutor

    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2)
    settings.discovery = _AddressDiscovery()
    executor = ElasticRayExecutor(settings, override_discovery=False)
    executor.start()
    assert executor.run(_log_rank) == [0, 1]


@pytest.mark.slow
def test_node_removed_mid_training_survivors_go_on(cluster, tmp_path):
    from hvdlite.ray import ElasticRayExecutor

    c, nodes = cluster
    path = tmp_path / "progress.jsonl"
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=3, elastic_timeout=60)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    seen: dict = {}
    remover = threading.Thread(target=_remove_a_worker_node, args=(c, nodes, path, 5, seen))
    remover.start()
    results = executor.run(lambda: _train(str(path), STEPS, 0.1))
    remover.join()
    rows = _progress(path)
    assert seen, "the node was never removed"
    assert rows[0][1] == 3 and rows[-1][1] == 2, rows
    after = [r for r in rows if r[1] == 2]
    print(
        "\nnode removed after step %d; survivors' next committed step %.2f s later"
        % (seen["step"], after[0][3] - seen["t"])
    )
    assert all(seen["node"] not in r[2] for r in after)
    # Two survivors, ranks 0 and 1, every committed step exactly once, the same weights on both,
    # and those weights are what the logged steps (3 ranks, then 2) give.
    assert [tuple(r[:2]) for r in results] == [(0, 2), (1, 2)]
    log = results[0][2]
    assert [s for s, _ in log] == list(range(STEPS)) and results[1][2] == log
    assert {size for _, size in log} == {3, 2}
    assert results[0][3] == results[1][3]
    np.testing.assert_allclose(results[0][3], _expected(log), rtol=1e-6)


def test_bad_worker_counts_are_refused():
    from hvdlite.ray import ElasticRayExecutor, RayExecutor

    with pytest.raises(ValueError, match="positive min_workers"):
        RayExecutor(RayExecutor.create_settings(), max_workers=2)
    with pytest.raises(ValueError, match="not both"):
        RayExecutor(RayExecutor.create_settings(), num_workers=2, min_workers=1)
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=3, max_num_proc=2))
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        executor.run(lambda: None)


def test_elastic_run_remote_and_execute_single_are_refused_as_in_horovod():
    """Horovod's elastic_v2 raises NotImplementedError for both (its workers are ephemeral);
    hvdlite's NotSupportedError is one."""
    from hvdlite.common.exceptions import NotSupportedError
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(), min_workers=1)
    with pytest.raises(NotSupportedError, match="ObjectRefs cannot be returned"):
        executor.run_remote(_sum_of_ranks, args=[1.0])
    with pytest.raises(NotImplementedError, match="does not support execute_single"):
        executor.execute_single(lambda executable: None)


def test_settings_are_mutable_and_a_discovery_set_on_them_is_used():
    """Horovod's examples set settings.discovery and pass override_discovery=False."""
    from hvdlite.ray import ElasticRayExecutor, RayExecutor, RayHostDiscovery

    mine = RayHostDiscovery(cpus_per_slot=2)
    settings = ElasticRayExecutor.create_settings(min_num_proc=1, verbose=2)
    settings.discovery = mine
    assert ElasticRayExecutor(settings, override_discovery=False).discovery is mine
    assert ElasticRayExecutor(settings).discovery is not mine
    static = RayExecutor.create_settings(timeout_s=5)
    static.discovery = mine
    assert RayExecutor(static, min_workers=1, override_discovery=False).adapter.discovery is mine
