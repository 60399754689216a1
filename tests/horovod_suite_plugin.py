"""pytest plugin loaded into every rank of a Horovod suite run (tests/horovod_suite.py, `-p
horovod_suite_plugin`). It is the rank's only reporting channel, so a rank killed mid-test still
leaves a record of what it was running.

Contract (environment set by the runner):
- HVDLITE_SUITE_LOG: directory; this rank appends one JSON line per event to
  rank.<rank>.jsonl (HVDLITE_RANK, or mpirun's rank variable), flushed at once: {"start": nodeid} when a test starts, then
  {"nodeid", "outcome" (passed|failed|skipped), "when", "sub", "reason"} for each report of it
  (one per failing or skipping phase, one per subtest, one for the call).
- HVDLITE_SUITE_TIMEOUT: seconds one test may take (setup, call and teardown together). Past it the
  rank dumps every thread's stack to stderr and exits (faulthandler, exit code 1): a hang in a C call
  cannot be interrupted from Python, and the runner then records the test as hung.
- HVDLITE_SUITE_DESELECT: optional file of node ids (one a line) to leave out: the tests a previous
  launch of the same file already ran (the runner resumes after a hang that way).
"""

import faulthandler
import json
import os

import pytest

_LOG = None
# The rank's number: hvdliterun and horovodrun set HVDLITE_RANK, mpirun its own.
_RANK_VARS = ("HVDLITE_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _log(record):
    global _LOG
    if _LOG is None:
        directory = os.environ["HVDLITE_SUITE_LOG"]
        rank = next((os.environ[v] for v in _RANK_VARS if v in os.environ), "0")
        _LOG = open(os.path.join(directory, "rank.%s.jsonl" % rank), "a", buffering=1)  # noqa: SIM115
    _LOG.write(json.dumps(record) + "\n")
    _LOG.flush()


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("HVDLITE_SUITE_DESELECT")
    if not path:
        return
    with open(path) as f:
        leave_out = {line.strip() for line in f if line.strip()}
    kept = [item for item in items if item.nodeid not in leave_out]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in leave_out])
    items[:] = kept


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    _log({"start": nodeid})
    timeout = float(os.environ.get("HVDLITE_SUITE_TIMEOUT", "0"))
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True)


def pytest_runtest_logfinish(nodeid, location):
    faulthandler.cancel_dump_traceback_later()


def _reason(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    if report.failed:
        text = str(report.longrepr)
        lines = [line for line in text.splitlines() if line.startswith("E ")]
        return "\n".join(lines[-6:]) if lines else text[-1500:]
    return ""


def pytest_runtest_logreport(report):
    # A record for each failing or skipping phase and for the call phase. "sub": a subtest's
    # report (tf.test.TestCase runs a test once per execution mode as subtests; a test whose every
    # subtest skipped counts as skipped, see horovod_suite._join).
    if report.when == "call" or report.outcome != "passed":
        if report.when == "teardown" and report.outcome == "skipped":
            return
        sub = hasattr(report, "context")
        record = {"nodeid": report.nodeid, "outcome": report.outcome, "when": report.when, "sub": sub}
        _log(dict(record, reason=_reason(report)))


def pytest_unconfigure(config):
    if _LOG is not None:
        _LOG.close()


def pytest_collectreport(report):
    if report.failed:  # an import error in the test file: one failed record named after the file
        _log({"start": report.nodeid})
        _log({"nodeid": report.nodeid, "outcome": "failed", "when": "collect", "reason": _reason(report)})
