"""The core collective tests again, but under a real `mpirun` (2 and 3 ranks, oversubscribed,
one compute thread per rank) on both CPU data paths: the native ring and the mpi backend.
The test bodies are those of test_collectives / test_process_sets / test_runtime, run with
their run_pooled swapped for mpi_helpers' mpirun runner. Plus what only MPI has:
ProcessSet(comm) from mpi4py, hvdliterun --mpi, mpi_built() / mpi_enabled()."""

import os
import subprocess
import sys

import numpy as np
import pytest
import test_collectives
import test_process_sets
import test_runtime
from helpers import run_ranks
from mpi_helpers import mpi_runner, run_mpi_ranks, skip_without_mpi

pytestmark = skip_without_mpi
# The default, auto, picks per collective and size: see test_auto_path_... The native ring under
# mpirun runs in the slow set (tests/test_collectives.py covers the ring itself by default).
PATHS = [pytest.param("ring", marks=pytest.mark.slow), "mpi"]


@pytest.mark.parametrize("cpu_ops", PATHS)
@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_allreduce_every_dtype_op_and_count(size, cpu_ops, monkeypatch):
    monkeypatch.setattr(test_collectives, "run_pooled", mpi_runner(cpu_ops))
    test_collectives.test_allreduce_every_dtype_op_and_count(size)


@pytest.mark.parametrize("cpu_ops", PATHS)
@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_allreduce_random_floats_bitwise_identical(size, cpu_ops, monkeypatch):
    monkeypatch.setattr(test_collectives, "run_pooled", mpi_runner(cpu_ops))
    test_collectives.test_allreduce_random_floats_bitwise_identical(size)


@pytest.mark.parametrize("cpu_ops", PATHS)
@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_allgather_broadcast_alltoall_reducescatter(size, cpu_ops, monkeypatch):
    monkeypatch.setattr(test_collectives, "run_pooled", mpi_runner(cpu_ops))
    test_collectives.test_allgather_broadcast_alltoall_reducescatter(size)


@pytest.mark.parametrize("cpu_ops", PATHS)
def test_async_inplace_noncontiguous_and_unnamed(cpu_ops, monkeypatch):
    monkeypatch.setattr(test_collectives, "run_pooled", mpi_runner(cpu_ops))
    test_collectives.test_async_inplace_noncontiguous_and_unnamed()


@pytest.mark.parametrize("cpu_ops", PATHS)
def test_process_sets_on_four_ranks(cpu_ops, monkeypatch):
    monkeypatch.setattr(test_process_sets, "run_pooled", mpi_runner(cpu_ops))
    test_process_sets.test_process_sets_on_four_ranks()


@pytest.mark.parametrize("cpu_ops", PATHS)
def test_init_after_shutdown_starts_a_new_session(cpu_ops, monkeypatch):
    monkeypatch.setattr(test_runtime, "run_pooled", mpi_runner(cpu_ops))
    test_runtime.test_init_after_shutdown_starts_a_new_session()


def test_join_on_the_mpi_backend(monkeypatch):
    monkeypatch.setattr(test_runtime, "run_pooled", mpi_runner("mpi"))
    test_runtime.test_join_lets_ranks_with_fewer_batches_finish()


def _half_precision_random(seed):
    """float16/bfloat16 go through user-defined MPI ops: sums of random values round
    differently in different orders, so equal bytes on every rank prove one order."""
    import ml_dtypes

    import hvdlite as hvd

    hvd.init()
    rng = np.random.default_rng(seed + hvd.rank())
    out = {}
    for dtype in (np.float16, ml_dtypes.bfloat16):
        for count in (1, 3, 1001):
            x = rng.standard_normal(count).astype(dtype)
            out[(np.dtype(dtype).name, count)] = hvd.allreduce(
                x, op=hvd.Sum, name="h%d" % count + np.dtype(dtype).name
            ).tobytes()
    hvd.shutdown()
    return out


@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_half_precision_sums_are_bitwise_identical_under_mpi(size):
    results = run_mpi_ranks(_half_precision_random, size, args=(5,), env={"HVDLITE_CPU_OPERATIONS": "mpi"})
    for key in results[0]:
        assert all(r[key] == results[0][key] for r in results), key


def _scaled_reductions():
    """Allreduce and reducescatter with prescale and postscale: the backend applies both."""
    import hvdlite as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {}
    for count in (7, 1 << 16):  # recursive doubling / ring sizes; odd rows split unevenly
        x = np.full(count, r + 1, np.float64)
        out[("ar", count)] = hvd.allreduce(
            x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5, name="ar%d" % count
        )
        out[("avg", count)] = hvd.allreduce(x, op=hvd.Average, prescale_factor=2.0, name="avg%d" % count)
        out[("rs", count)] = hvd.reducescatter(
            x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.25, name="rs%d" % count
        )
        assert np.all(x == r + 1), "the reducescatter input was modified"
    hvd.shutdown()
    return r, n, out


@pytest.mark.parametrize("cpu_ops", PATHS)
def test_prescale_and_postscale_on_both_paths(cpu_ops):
    results = run_mpi_ranks(_scaled_reductions, 3, env={"HVDLITE_CPU_OPERATIONS": cpu_ops})
    for r, n, out in results:
        total = sum(k + 1 for k in range(n))
        for count in (7, 1 << 16):
            assert np.all(out[("ar", count)] == 3.0 * total * 0.5)
            assert np.all(out[("avg", count)] == 2.0 * total / n)
            mine = count // n + (1 if r < count % n else 0)
            assert out[("rs", count)].shape == (mine,)
            assert np.all(out[("rs", count)] == 3.0 * total * 0.25)


def _sizes_either_side_of_the_split():
    """auto's choice (csrc/backend/split_backend.h: today the ring for every size, as measured)
    gives the same results at sizes either side of the ring's own algorithm thresholds."""
    import hvdlite as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    sub = hvd.add_process_set([0, 1])
    out = {}
    for count in (5, 1 << 14, 300001):  # 20 B, exactly 64 KiB, 1.2 MB of float32
        x = np.arange(count, dtype=np.float32) % 7 + r
        out[("sum", count)] = hvd.allreduce(x, op=hvd.Sum, name="s%d" % count)[:8].tolist()
        out[("bcast", count)] = float(hvd.broadcast(x, root_rank=n - 1, name="b%d" % count)[-1])
        out[("gather", count)] = hvd.allgather(x[: count // n], name="g%d" % count).shape
        out[("rs", count)] = hvd.reducescatter(
            np.ones(count, np.float32), op=hvd.Sum, name="r%d" % count
        ).sum()
        if r < 2:
            out[("sub", count)] = hvd.allreduce(
                np.ones(count, np.float64), op=hvd.Sum, process_set=sub, name="p%d" % count
            )[-1]
    out["a2a"] = hvd.alltoall(np.full((n * 3, 2), r, np.int64), name="a2a")[:, 0].tolist()
    hvd.shutdown()
    return out


def test_auto_path_gives_the_same_results_on_both_sides_of_its_split():
    results = run_mpi_ranks(_sizes_either_side_of_the_split, 3, env={"HVDLITE_CPU_OPERATIONS": None})
    for r, out in enumerate(results):
        for count in (5, 1 << 14, 300001):
            x = np.arange(count, dtype=np.float32) % 7
            assert out[("sum", count)] == (3 * x[:8] + 3).tolist()
            assert out[("bcast", count)] == float(x[-1] + 2)
            assert out[("gather", count)] == (count // 3 * 3,)
            mine = count // 3 + (1 if r < count % 3 else 0)
            assert out[("rs", count)] == 3.0 * mine
            if r < 2:
                assert out[("sub", count)] == 2.0
        assert out["a2a"] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def _identity_and_capabilities():
    import hvdlite as hvd

    before = hvd.mpi_enabled()
    hvd.init()
    out = dict(
        before=before,
        built=hvd.mpi_built(),
        enabled=hvd.mpi_enabled(),
        threads=hvd.mpi_threads_supported(),
        rank=hvd.rank(),
        size=hvd.size(),
        local=(hvd.local_rank(), hvd.local_size()),
        env_rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
    )
    hvd.shutdown()
    out["after"] = hvd.mpi_enabled()
    return out


@pytest.mark.parametrize("cpu_ops", PATHS)
def test_identity_comes_from_mpi_and_capabilities_tell_the_truth(cpu_ops):
    results = run_mpi_ranks(_identity_and_capabilities, 3, env={"HVDLITE_CPU_OPERATIONS": cpu_ops})
    for r, out in enumerate(results):
        assert (out["rank"], out["size"], out["env_rank"], out["local"]) == (r, 3, r, (r, 3))
        assert out["built"] and out["enabled"] and out["threads"]
        assert not out["before"] and not out["after"]


def test_capabilities_outside_mpi():
    import hvdlite as hvd

    assert hvd.mpi_built() is True
    assert hvd.mpi_enabled() is False
    assert hvd.gloo_built() is True  # issue 4: gloo_* report the native ring backend
    assert bool(hvd.nccl_built()) == bool(hvd._core.build_info()["nccl"])


def _comm_process_sets():
    from mpi4py import MPI

    import hvdlite as hvd

    world = MPI.COMM_WORLD
    halves = hvd.ProcessSet(world.Split(world.rank % 2, world.rank))  # differs per rank, as in Horovod
    hvd.init(process_sets=[halves])
    low = hvd.add_process_set(hvd.ProcessSet(world.Split(int(world.rank < 2), world.rank)))  # [0, 1], [2]
    out = {
        "halves": halves.ranks,
        "low": (low.process_set_id, low.ranks),
        "rank_in": halves.rank(),
        "sum": hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, process_set=halves).tolist(),
        "low_sum": hvd.allreduce(np.array([1.0]), op=hvd.Sum, process_set=low).tolist(),
        "mpi4py_too": world.allreduce(1),
    }  # the user's own MPI traffic beside hvdlite's
    assert hvd.remove_process_set(halves) and hvd.remove_process_set(low)
    out["after"] = hvd.allreduce(np.array([1.0]), op=hvd.Sum).tolist()
    hvd.shutdown()
    return out


@pytest.mark.parametrize("cpu_ops", PATHS)
def test_process_set_from_mpi4py_communicator(cpu_ops):
    results = run_mpi_ranks(_comm_process_sets, 3, env={"HVDLITE_CPU_OPERATIONS": cpu_ops})
    for r, out in enumerate(results):
        mine = [0, 2] if r % 2 == 0 else [1]
        assert out["halves"] == mine and out["rank_in"] == mine.index(r)
        assert out["sum"] == [float(sum(m + 1 for m in mine))]
        assert out["low"] == ((3, [0, 1]) if r < 2 else (4, [2])) and out["mpi4py_too"] == 3
        assert out["low_sum"] == [2.0 if r < 2 else 1.0]
        assert out["after"] == [3.0]


def _comm_duplicates():
    from mpi4py import MPI

    import hvdlite as hvd

    world = MPI.COMM_WORLD
    hvd.init()
    pair = hvd.add_process_set([0, 2])
    out = {}
    for case, comm in (
        ("world", world.Dup()),  # the global set
        ("split", world.Split(world.rank % 2, world.rank)),  # [0, 2] on even ranks only, [1] is new
    ):
        try:
            hvd.add_process_set(hvd.ProcessSet(comm))
            out[case] = None
        except ValueError as e:
            out[case] = str(e)
    out["ids"] = hvd.common.basics._get_process_set_ids_and_ranks()  # nothing half-registered
    odd = hvd.add_process_set(hvd.ProcessSet(world.Split(world.rank % 2, world.rank)), allow_duplicate=True)
    out["allowed"] = odd.process_set_id
    assert hvd.remove_process_set(pair) and hvd.remove_process_set(odd)
    hvd.shutdown()
    return out


def test_a_communicator_set_that_duplicates_a_registered_set_is_a_value_error():
    """As add_process_set([ranks]) is: the communicator's groups are gathered from every rank, so
    every rank raises alike, naming the ranks whose communicator is the duplicate."""
    for r, out in enumerate(run_mpi_ranks(_comm_duplicates, 3)):
        assert (
            "rank(s) [0, 1, 2] has ranks [0, 1, 2], a duplicate of the registered process set 0"
            in out["world"]
        )
        assert "rank(s) [0, 2] has ranks [0, 2], a duplicate of the registered process set 1" in out["split"]
        assert "has ranks [1]," not in out["split"]  # the odd rank's group is new
        assert out["ids"] == {0: [0, 1, 2], 1: [0, 2]}
        assert out["allowed"] == (2 if r % 2 == 0 else 3)  # allow_duplicate: each group its own id


def test_process_set_from_comm_needs_an_mpi_job():

    for err in run_ranks(_comm_set_without_mpirun, 1, timeout=60):
        assert "mpirun" in err


def _comm_set_without_mpirun():
    from mpi4py import MPI

    import hvdlite as hvd

    hvd.init()
    try:
        hvd.add_process_set(hvd.ProcessSet(MPI.COMM_WORLD))
        return ""
    except hvd.PreconditionError as e:
        return str(e)
    finally:
        hvd.shutdown()


def test_mpi_backend_needs_an_mpi_launcher():
    from helpers import spawn_ranks

    results = spawn_ranks(
        test_collectives._other_collectives, 2, timeout=60, env={"HVDLITE_CPU_OPERATIONS": "mpi"}
    )
    for r in results:
        assert r.exitcode != 0 and "launched by mpirun" in r.traceback


def test_hvdliterun_mpi_launches_through_mpirun():
    code = (
        "import numpy as np, hvdlite as hvd; hvd.init(); "
        "print('sum', hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, name='x')[0], hvd.rank(), "
        "hvd.size(), hvd.mpi_enabled()); hvd.shutdown()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_", "OMPI_"))}
    res = subprocess.run(
        [sys.executable, "-m", "hvdlite.runner.launch", "--mpi", "-np", "2", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    lines = sorted(line for line in res.stdout.splitlines() if "<stdout>:" in line)
    assert lines == ["[0]<stdout>:sum 3.0 0 2 True", "[1]<stdout>:sum 3.0 1 2 True"], res.stdout
    failing = subprocess.run(
        [
            sys.executable,
            "-m",
            "hvdlite.runner.launch",
            "--mpi",
            "-np",
            "2",
            sys.executable,
            "-c",
            "import sys; sys.exit(3)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failing.returncode == 3, failing.stdout + failing.stderr


def _init_with_comm():
    from mpi4py import MPI

    import hvdlite as hvd

    world = MPI.COMM_WORLD
    halves = world.Split(world.rank % 2, world.rank)
    out = {}
    try:
        hvd.init(comm=world, process_sets=[hvd.ProcessSet(halves), hvd.ProcessSet(world.Dup())])
    except ValueError as e:
        out["duplicate"] = str(e)
    out["initialized"] = hvd.is_initialized()  # as in Horovod: the global set only, init() again
    mine = hvd.ProcessSet(halves)
    hvd.init(comm=world, process_sets=[mine])
    out["comm_is_world"] = hvd.global_process_set.mpi_comm is world
    out["ids"] = hvd.common.basics._get_process_set_ids_and_ranks()
    out["mine"] = (mine.process_set_id, mine.ranks)
    hvd.shutdown()
    return out


@skip_without_mpi
def test_init_with_the_world_communicator_and_communicator_sets():
    for r, out in enumerate(run_mpi_ranks(_init_with_comm, 3)):
        assert "entry 1" in out["duplicate"] and "global process set" in out["duplicate"]
        assert out["initialized"] and out["comm_is_world"]
        assert out["ids"] == {0: [0, 1, 2], 1: [0, 2], 2: [1]}
        assert out["mine"] == ((1, [0, 2]) if r % 2 == 0 else (2, [1]))
