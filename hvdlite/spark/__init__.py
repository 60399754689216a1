"""hvdlite on Spark: run(fn, ...) runs fn on num_proc ranks, one per task of a barrier stage, and
returns their results in rank order (Horovod's horovod.spark.run, on barrier mode: no driver or
task services of its own). Needs pyspark (`pip install hvdlite[spark]`) and an active SparkContext.

How a job forms (docs/launchers.md, "Spark"):
  - first, one probe task per rank checks that the Python Spark's executors run for tasks
    (PYSPARK_PYTHON) can import hvdlite, and raises at once naming the fix when it cannot
    (executors.py);
  - the driver draws the job's secret and ships it to the tasks inside the stage's closure (as
    protected as Spark's own RPC is: enable spark.authenticate and its encryption to keep it
    from the network);
  - task 0 hosts the rendezvous store in its Python worker on a free port; the tasks exchange its
    address through BarrierTaskContext.allGather, Spark's own rendezvous;
  - each task starts fn in a child process (`executable`, default sys.executable) whose
    environment holds the job description (hvdlite.common.job.write: rank = the partition id,
    size = num_proc, the store and the secret; the core computes local and cross topology from the
    host names), plus `env`; fn's hvd.init() joins the job as under hvdliterun;
  - every task waits at a barrier after its child exits, so the store outlives every rank; a task
    whose child failed fails at once with the child's exit code and the end of its stderr. Spark
    then kills the stage's other tasks (their children die with their Python workers) and runs the
    whole barrier stage again, a new job with a new store, up to spark.stage.maxConsecutiveAttempts
    times (a shuffle follows the stage so that Spark may retry it), then fails the job with that
    error.
"""

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from hvdlite.common import exceptions
from hvdlite.common import job as jobs
from hvdlite.spark import executors

STDERR_TAIL = 4000  # characters of a failed rank's stderr put in the task's error
RESET_LIMIT_MESSAGE = "Horovod was shutdown because number of resets during elastic job exceeded limit: {}"


def _pickler() -> Any:
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:  # pyspark ships its own copy
        from pyspark import cloudpickle as pyspark_cloudpickle

        return pyspark_cloudpickle


def _host_of(address: str) -> str:
    return address.rpartition(":")[0] or address


def _rendezvous(ctx: Any, secret_hex: str) -> tuple[str, Any]:
    """(store address, the server when this task hosts it) through the barrier's allGather."""
    server = None
    message = ""
    if ctx.partitionId() == 0:
        from hvdlite.common.native import core as _core

        server = _core.TcpStoreServer(
            "0.0.0.0", 0, bytes.fromhex(secret_hex), clients=2 * len(ctx.getTaskInfos())
        )
        message = "%s:%d" % (_host_of(ctx.getTaskInfos()[0].address), server.port)
    return ctx.allGather(message)[0], server


def _die_with_parent() -> None:
    """In the rank's child process: SIGKILL it when the Python worker that started it dies (Spark
    kills the other tasks' workers when one task of a barrier stage fails)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the rank ends at its own timeout instead


def _run_rank(payload: bytes, env: dict[str, str], executable: str) -> bytes:
    """Runs the pickled (fn, args, kwargs) in a child process with `env`; its pickled result."""
    with tempfile.TemporaryDirectory(prefix="hvdlite-spark-") as d:
        with open(os.path.join(d, "fn.pkl"), "wb") as f:
            f.write(payload)
        proc = subprocess.run(
            [executable, "-m", "hvdlite.spark.task", d],
            env=env,
            stdout=None,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent,
        )
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            raise exceptions.HvdliteInternalError(
                "hvdlite.spark: rank %s exited with code %d; the end of its stderr:\n%s"
                % (env["HVDLITE_RANK"], proc.returncode, proc.stderr[-STDERR_TAIL:])
            )
        with open(os.path.join(d, "result.pkl"), "rb") as f:
            return f.read()


def _task_body(
    payload: bytes,
    num_proc: int,
    secret_hex: str,
    extra_env: dict[str, str],
    executable: str,
) -> Callable[[Iterable[int]], Iterator[tuple[int, bytes]]]:
    """The function of the barrier stage's tasks (runs on the executors)."""

    def body(_: Iterable[int]) -> Iterator[tuple[int, bytes]]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        store_addr, server = _rendezvous(ctx, secret_hex)
        env = dict(os.environ)
        env.update(extra_env)
        jobs.write(env, jobs.Job(rank, num_proc, store_addr=store_addr, secret=secret_hex))
        env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            result = _run_rank(payload, env, executable)
            ctx.barrier()  # every rank done before task 0's store goes (a failed one does not wait)
        finally:
            if server is not None:
                server.stop()
        yield rank, result

    return body


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    num_proc: int | None = None,
    start_timeout: int | None = None,
    use_mpi: bool | None = None,
    use_gloo: bool | None = None,
    extra_mpi_args: str | None = None,
    env: dict[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Any = None,
    prefix_output_with_timestamp: bool = False,
    executable: str | None = None,
) -> list[Any]:
    """Horovod's horovod.spark.run(): `fn(*args, **kwargs)` on num_proc ranks (default
    spark.default.parallelism), one per task of a barrier stage; returns their results in rank
    order. env: variables added to each rank's environment; executable: the Python that runs fn
    (default sys.executable). Horovod's use_mpi, use_gloo, extra_mpi_args, stdout, stderr, nics and
    prefix_output_with_timestamp have no effect (the ranks' output goes to the executors' logs);
    start_timeout bounds hvd.init()'s wait for the other ranks (HVDLITE_START_TIMEOUT)."""
    sc = _spark_context("run")
    num_proc = num_proc or sc.defaultParallelism
    executors.check(sc, num_proc, "run")
    return _run_stage(sc, fn, args, kwargs, num_proc, _rank_env(env, start_timeout, verbose), executable)


def _spark_context(caller: str) -> Any:
    import pyspark

    sc = pyspark.SparkContext._active_spark_context
    if sc is None:
        raise exceptions.PreconditionError(
            "hvdlite.spark.%s: no active SparkContext; start a SparkSession first" % caller
        )
    return sc


def _rank_env(env: dict[str, str] | None, start_timeout: int | None, verbose: int) -> dict[str, str]:
    """The variables run()'s arguments add to each rank's environment."""
    extra = {k: str(v) for k, v in (env or {}).items()}
    if start_timeout is not None:
        extra["HVDLITE_START_TIMEOUT"] = str(start_timeout)
    if verbose >= 2:
        extra.setdefault("HVDLITE_LOG_LEVEL", "debug")
    return extra


def _run_stage(
    sc: Any,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    num_proc: int,
    extra: dict[str, str],
    executable: str | None,
    spark_retries: bool = True,
) -> list[Any]:
    """fn on num_proc ranks in one barrier stage (module doc); the results in rank order.
    spark_retries: Spark retries the stage when a task fails; else the job fails at once."""
    payload = _pickler().dumps((fn, tuple(args), dict(kwargs or {})))
    secret = os.urandom(32).hex()
    body = _task_body(payload, num_proc, secret, extra, executable or sys.executable)
    # The shuffle after the barrier stage makes it a ShuffleMapStage, which Spark retries as a
    # whole when a task fails (spark.stage.maxConsecutiveAttempts); a barrier ResultStage is
    # aborted at the first failure.
    ranks = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(body)
    pairs = ranks.partitionBy(1).collect() if spark_retries else ranks.collect()
    return [pickle.loads(result) for _, result in sorted(pairs)]


def run_elastic(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    num_proc: int | None = None,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    start_timeout: int | None = None,
    elastic_timeout: int | None = None,
    reset_limit: int | None = None,
    env: dict[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Any = None,
    prefix_output_with_timestamp: bool = False,
    min_np: int | None = None,
    max_np: int | None = None,
    executable: str | None = None,
) -> list[Any]:
    """Horovod's horovod.spark.run_elastic() on barrier mode: `fn(*args, **kwargs)` on num_proc
    ranks (default spark.default.parallelism), results in rank order.

    Semantics (docs/launchers.md, "Spark"): a barrier stage's tasks run together or not at all,
    and when one fails Spark kills the others and runs the whole stage again; a stage cannot go on
    with fewer tasks. So a rank that dies does not leave survivors to continue at a smaller size:
    the job is retried as a whole, a new job of num_proc ranks with a new store, and fn starts
    again from its beginning (the state committed in the failed attempt is in the failed
    processes' memory and is lost; persist it yourself, e.g. a checkpoint fn reloads, to resume).
    The result is that of the attempt that completes. Retries: without reset_limit, Spark retries
    the stage (spark.stage.maxConsecutiveAttempts, as run()); with reset_limit, this driver
    submits the job again, at most reset_limit times after the first, then raises
    HvdliteInternalError with Horovod's reset-limit message and the last attempt's error.
    min_num_proc/max_num_proc (min_np/max_np: Horovod's deprecated names) are checked
    (min <= num_proc <= max) and otherwise have no effect; elastic_timeout has none (Spark
    schedules the retried stage); the other arguments are run()'s."""
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    sc = _spark_context("run_elastic")
    num_proc = num_proc or sc.defaultParallelism
    low = num_proc if min_num_proc is None else min_num_proc
    high = num_proc if max_num_proc is None else max_num_proc
    if not 1 <= low <= num_proc <= high:
        raise exceptions.InvalidArgumentError(
            "hvdlite.spark.run_elastic: want 1 <= min_num_proc <= num_proc <= max_num_proc, got "
            "%s <= %s <= %s (a barrier stage runs exactly num_proc tasks)" % (low, num_proc, high)
        )
    executors.check(sc, num_proc, "run_elastic")
    extra = _rank_env(env, start_timeout, verbose)
    if reset_limit is None:
        return _run_stage(sc, fn, args, kwargs, num_proc, extra, executable)
    for _ in range(reset_limit):
        try:
            return _run_stage(sc, fn, args, kwargs, num_proc, extra, executable, spark_retries=False)
        except Exception as e:  # py4j's error of the failed Spark job: retried as a whole
            sys.stderr.write("hvdlite.spark.run_elastic: the job failed, retrying it: %s\n" % str(e)[:500])
    try:
        return _run_stage(sc, fn, args, kwargs, num_proc, extra, executable, spark_retries=False)
    except Exception as e:
        raise exceptions.HvdliteInternalError(
            "%s; the last attempt's error: %s" % (RESET_LIMIT_MESSAGE.format(reset_limit), e)
        ) from e
