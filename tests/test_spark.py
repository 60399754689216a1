"""hvdlite.spark.run on a real Spark: local-cluster[2,1,1024] (two executor JVMs, one core each),
a barrier stage whose tasks run the ranks. Skipped where pyspark or Java is missing."""

import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _allreduce(scale):
    import numpy as np

    import hvdlite as hvd

    hvd.init()
    out = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum, name="spark")
    result = (hvd.rank(), hvd.size(), float(out[0]) * scale, os.environ.get("FROM_ENV"))
    hvd.shutdown()
    return result


def _rank_one_dies_on_the_first_attempt(marker):
    import hvdlite as hvd

    if os.environ["HVDLITE_RANK"] == "1" and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(7)  # before init(): rank 0 waits in init() until Spark kills its task
    hvd.init()
    rank = hvd.rank()
    hvd.shutdown()
    return rank


def _digits_demo(epochs):
    """examples/pytorch_digits.py as its own script, in this rank: returns what it printed."""
    import contextlib
    import io
    import runpy

    demo = str(REPO / "examples" / "pytorch_digits.py")
    sys.path.insert(0, os.path.dirname(demo))
    sys.argv = [demo, "--epochs", str(epochs)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(demo, run_name="__main__")
    return out.getvalue()


def _fail_on_rank_one():
    import hvdlite as hvd

    hvd.init()
    rank = hvd.rank()
    if rank == 1:
        raise ValueError("rank one gives up")
    hvd.shutdown()
    return rank


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java (apt-get install openjdk-17-jre-headless)")
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    path = os.pathsep.join([str(REPO), str(REPO / "tests")])
    session = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("hvdlite-spark-test")
        .config("spark.executorEnv.PYTHONPATH", path)
        .config("spark.executorEnv.OMP_NUM_THREADS", "1")
        .config("spark.stage.maxConsecutiveAttempts", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    yield session
    session.stop()


def test_run_returns_every_rank_result_in_rank_order(spark):
    import hvdlite.spark

    got = hvdlite.spark.run(_allreduce, args=(2.0,), num_proc=2, env={"FROM_ENV": "yes"})
    assert got == [(0, 2, 6.0, "yes"), (1, 2, 6.0, "yes")]


def test_a_failing_rank_fails_the_job_with_its_error(spark):
    """Rank 1 raises on every attempt: after the stage's attempts the job fails with its error."""
    import hvdlite.spark

    with pytest.raises(Exception, match="rank one gives up"):
        hvdlite.spark.run(_fail_on_rank_one, num_proc=2, start_timeout=30)


def test_a_task_that_dies_is_retried_with_its_stage(spark, tmp_path):
    """Spark retries the whole barrier stage (spark.stage.maxConsecutiveAttempts=2 here); the second attempt
    forms a new job with a new store and returns."""
    import hvdlite.spark

    marker = str(tmp_path / "died-once")
    assert hvdlite.spark.run(_rank_one_dies_on_the_first_attempt, args=(marker,), num_proc=2) == [0, 1]
    assert os.path.exists(marker)


def test_the_digits_demo_trains_unchanged(spark):
    import hvdlite.spark

    printed = hvdlite.spark.run(_digits_demo, args=(1,), num_proc=2, env={"OMP_NUM_THREADS": "1"})
    assert "on 2 ranks" in printed[0], printed


def _elastic_loop(marker, steps):
    """An hvd.elastic.run loop; rank 1 kills itself mid-training (after step 3's commit) on the
    first attempt only. Returns (rank, size, the (step, size) log, the weights)."""
    import signal

    import numpy as np

    import hvdlite as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(step=0, w=np.zeros(4), log=[])

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            grad = np.full(4, (state.step + 1) * 0.01 + hvd.rank())
            state.w = state.w - 0.1 * hvd.allreduce(grad, op=hvd.Average, name="grad")
            state.log.append((state.step, hvd.size()))
            state.step += 1
            state.commit()
            if hvd.rank() == 1 and state.step == 4 and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return state.w

    w = train(state)
    return hvd.rank(), hvd.size(), state.log, w.tolist()


def test_run_elastic_a_rank_killed_mid_training_retries_the_job(spark, tmp_path):
    """run_elastic's semantics on barrier mode: the killed rank fails its task, Spark runs the
    whole stage again, and the retried job's result is the full training's."""
    import numpy as np

    import hvdlite.spark

    marker = str(tmp_path / "killed-once")
    got = hvdlite.spark.run_elastic(
        _elastic_loop, args=(marker, 10), num_proc=2, min_num_proc=2, max_num_proc=2, start_timeout=60
    )
    assert os.path.exists(marker)
    w = np.zeros(4)
    for step in range(10):
        w = w - 0.1 * np.mean([np.full(4, (step + 1) * 0.01 + r) for r in range(2)], axis=0)
    assert [g[:2] for g in got] == [(0, 2), (1, 2)]
    assert got[0][2] == got[1][2] == [(s, 2) for s in range(10)]
    np.testing.assert_allclose(got[0][3], w, rtol=1e-6)
    assert got[0][3] == got[1][3]


def test_run_elastic_reset_limit_and_sizes(spark, tmp_path):
    import hvdlite.spark

    with pytest.raises(ValueError, match="min_num_proc <= num_proc"):
        hvdlite.spark.run_elastic(_elastic_loop, num_proc=2, min_num_proc=3)
    # With reset_limit the driver resubmits the job: 0 allows no retry, 1 lets the second run
    # (rank 1 killed only once) complete.
    marker = str(tmp_path / "killed-once")
    with pytest.raises(RuntimeError, match="exceeded limit: 0"):
        hvdlite.spark.run_elastic(_elastic_loop, args=(marker, 6), num_proc=2, reset_limit=0)
    got = hvdlite.spark.run_elastic(
        _elastic_loop, args=(str(tmp_path / "again"), 6), num_proc=2, reset_limit=1
    )
    assert [g[2] for g in got] == [[(s, 2) for s in range(6)]] * 2


# The driver of test_executors_without_hvdlite_are_reported_at_once: a Spark local cluster whose
# executors run PYSPARK_PYTHON = a Python without hvdlite; prints the error and how long run() took.
_MISCONFIGURED_DRIVER = """
import json, os, sys, time
sys.path.insert(0, {repo!r})
os.environ["PYSPARK_PYTHON"] = {python!r}
from pyspark.sql import SparkSession
session = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("hvdlite-misconfigured")
           .config("spark.ui.enabled", "false").getOrCreate())
import hvdlite.spark
out = {{}}
for call in ("run", "run_elastic"):
    start = time.monotonic()
    try:
        getattr(hvdlite.spark, call)(abs, args=(-1,), num_proc=2)
        out[call] = ["no error", "", 0.0]
    except Exception as e:
        out[call] = [type(e).__name__, str(e), time.monotonic() - start]
session.stop()
print("RESULT " + json.dumps(out))
"""


def test_executors_without_hvdlite_are_reported_at_once(tmp_path):
    """The driver's Python has hvdlite; the executors start another Python (PYSPARK_PYTHON = a
    fresh virtual environment of the same Python version, with no packages). run() and
    run_elastic() raise hvdlite's PreconditionError from their probe task, before any barrier
    stage (Spark's own failure would be a Py4J error after the stage's retries), naming
    PYSPARK_PYTHON, the executors' Python and the fix."""
    import json
    import subprocess

    if shutil.which("java") is None:
        pytest.skip("Spark needs Java (apt-get install openjdk-17-jre-headless)")
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    assert subprocess.run([python, "-c", "import hvdlite"], capture_output=True, timeout=60).returncode != 0
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    code = _MISCONFIGURED_DRIVER.format(repo=str(REPO), python=python)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-3000:]
    for call, (kind, message, seconds) in json.loads(lines[0][len("RESULT ") :]).items():
        print("%s: %s after %.1f s" % (call, kind, seconds))  # the report's number, not asserted
        assert kind == "PreconditionError", (call, kind, message)
        assert "hvdlite.spark.%s:" % call in message and "PYSPARK_PYTHON" in message, message
        assert python in message and "No module named 'hvdlite'" in message, message
        assert "Fix: set PYSPARK_PYTHON" in message and "pip install hvdlite" in message, message
