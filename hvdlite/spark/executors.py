"""The check hvdlite.spark.run and run_elastic make before their barrier stage: can the Python that
Spark's executors start for tasks import hvdlite?

Spark runs a task's Python in PYSPARK_PYTHON (spark.pyspark.python), else `python3` on the
executors' PATH, not in the driver's Python. When that Python lacks hvdlite (the driver runs in a
virtual environment, the executors in the system Python), the barrier stage's tasks cannot even
be unpickled: each fails with ModuleNotFoundError, Spark retries the stage
(spark.stage.maxConsecutiveAttempts) and the error surfaces minutes later, buried in a Py4J
trace. Instead, check() runs one short probe task per rank first (an ordinary stage, not a
barrier one) whose function cloudpickle ships by value and which imports hvdlite itself, and
raises at once, naming the executors' Python, PYSPARK_PYTHON and the fix.

Cost: one small Spark job per call (scheduling num_proc trivial tasks plus one import of
hvdlite in each executor's Python worker, which Spark keeps for the stage that follows). It
blocks while Spark schedules it, as the barrier stage itself would.
"""

import os
import sys
from typing import Any

from hvdlite.common import exceptions


def _probe_function() -> Any:
    """The probe task's function. A nested function that names no global of this module and
    imports what it uses itself: cloudpickle ships it by value, so it runs on an executor whose
    Python has no hvdlite (a module-level function would be shipped by reference, and loading it
    there would fail the same way as the job)."""

    def probe(_: Any) -> tuple[str, str, str, str | None]:
        import socket
        import sys as executor_sys

        try:
            import hvdlite.spark  # noqa: F401 -- what the barrier stage's tasks load first
        except Exception as e:  # any failure to import is the finding, reported to the driver
            error: str | None = "%s: %s" % (type(e).__name__, e)
        else:
            error = None
        return socket.gethostname(), executor_sys.executable, executor_sys.version.split()[0], error

    return probe


def _message(caller: str, sc: Any, bad: list[tuple[str, str, str, str | None]]) -> str:
    _, python, version, error = bad[0]
    configured = getattr(sc, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON") or "unset (python3)"
    hosts = sorted({b[0] for b in bad})
    return (
        "hvdlite.spark.%s: the Python that Spark's executors run for tasks cannot import hvdlite "
        "(%s, Python %s, on %s: %s). Spark starts PYSPARK_PYTHON for tasks (here %s), else python3 "
        "on the executors' PATH, not this driver's Python (%s). Fix: set PYSPARK_PYTHON to a Python "
        "that has hvdlite on every executor (e.g. PYSPARK_PYTHON=%s in the environment before the "
        "SparkContext starts, or spark.pyspark.python; add spark.executorEnv.PYTHONPATH if hvdlite "
        "is not installed but on a path), or install hvdlite into the executors' Python "
        "(pip install hvdlite)."
        % (caller, python, version, ", ".join(hosts), error, configured, sys.executable, sys.executable)
    )


def check(sc: Any, num_proc: int, caller: str) -> None:
    """Raises PreconditionError (naming PYSPARK_PYTHON and the fix) when the Python of the
    executors that would run the job's num_proc tasks cannot import hvdlite (module doc)."""
    probe = _probe_function()
    try:
        found = sc.parallelize(range(num_proc), num_proc).map(probe).collect()
    except Exception as e:  # py4j's error: the executors' Python could not run a trivial task
        raise exceptions.PreconditionError(
            "hvdlite.spark.%s: a trivial probe task failed on the executors before the job started, "
            "so Spark cannot run Python tasks there; check PYSPARK_PYTHON (here %s): it must name a "
            "Python, with hvdlite installed, that exists on every executor. Spark's error: %s"
            % (caller, getattr(sc, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON"), str(e)[:2000])
        ) from e
    bad = [f for f in found if f[3] is not None]
    if bad:
        raise exceptions.PreconditionError(_message(caller, sc, bad))
