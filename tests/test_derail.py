"""A derailed job never hangs (issue 9).

Horovod's test suites run one pytest process per rank with init()/shutdown() around each
test. When the ranks fail differently, one rank shuts down and re-inits while another still
waits on a collective. Every rank must get an error within a bound, and the next shutdown()
and init() must start clean in the same processes, over shared memory and over TCP alike.

No wall time is asserted: the bounds are the tests' timeouts, far below the default stall
(600 s), I/O (120 s) and shutdown (15 s) timeouts that would otherwise be the only way out.
"""

import os
import time

import numpy as np
import pytest
from helpers import run_ranks

TRANSPORTS = {"shm": {}, "tcp": {"HVDLITE_SHM_DISABLE": "1"}}


def _next_job_works(hvd):
    """The clean restart every rank must be able to make: init(), one collective, shutdown()."""
    hvd.init()
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="next.job").tolist()
    hvd.shutdown()
    return out


def _failure(call):
    try:
        call()
        return None
    except Exception as e:
        return type(e).__name__, isinstance(e, __import__("hvdlite").HvdliteInternalError), str(e)


def _coordinator_leaves(marker, when):
    """Rank 0 (the coordinator) raises before a collective rank 1 runs, shuts down and
    inits again; rank 1 submits the collective before rank 0 has left, or after."""
    import hvdlite as hvd

    hvd.init()
    hvd.allreduce(np.ones(2), name="warmup")
    if hvd.rank() == 0:
        if when == "before_leave":
            time.sleep(0.5)  # rank 1 is waiting on 'late' by now
        hvd.shutdown()  # gives up on rank 1 after HVDLITE_SHUTDOWN_TIMEOUT_SECONDS
        open(marker, "w").close()
        return None, _next_job_works(hvd)
    if when == "after_leave":
        while not os.path.exists(marker):  # rank 0 has shut down and closed its connections
            time.sleep(0.05)
    late = [np.ones(2), np.ones(3)]  # a grouped allreduce, as in the hang seen with Horovod's suite
    failures = (
        _failure(lambda: [hvd.synchronize(h) for h in hvd.grouped_allreduce_async(late, name="late")]),
        _failure(lambda: hvd.allreduce(np.ones(2), name="later")),
    )
    hvd.shutdown()
    return failures, _next_job_works(hvd)


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize("when", ["before_leave", "after_leave"])
def test_rank_waiting_on_a_departed_coordinator_fails_then_reinits(tmp_path, transport, when):
    env = dict(TRANSPORTS[transport], HVDLITE_SHUTDOWN_TIMEOUT_SECONDS="1")
    results = run_ranks(_coordinator_leaves, 2, args=(str(tmp_path / "left"), when), env=env, timeout=45)
    for failure in results[1][0]:
        assert failure is not None, results[1]
        _, internal, message = failure
        assert internal, failure  # Horovod's HorovodInternalError
        assert "rank 0" in message and "shut down" in message, message
    assert [out for _, out in results] == [[2.0, 2.0], [2.0, 2.0]]


def test_every_waiting_rank_names_the_departed_coordinator(tmp_path):
    """With 3 ranks, ranks 1 and 2 both blame rank 0, never each other."""
    env = {"HVDLITE_SHUTDOWN_TIMEOUT_SECONDS": "1"}
    results = run_ranks(
        _coordinator_leaves, 3, args=(str(tmp_path / "left"), "after_leave"), env=env, timeout=45
    )
    for failures, out in results[1:]:
        for failure in failures:
            assert failure is not None and failure[1], failures
            assert "rank 0" in failure[2] and "shut down" in failure[2], failure
            assert "crashed" not in failure[2], failure
        assert out == [3.0, 3.0]


def _peer_leaves_mid_wait(marker):
    """Rank 1 (not the coordinator) leaves while rank 0 waits on a collective it never
    submits, then inits again."""
    import hvdlite as hvd

    hvd.init()
    hvd.allreduce(np.ones(2), name="warmup")
    if hvd.rank() == 1:
        time.sleep(0.5)  # rank 0 is waiting on 'late' by now
        hvd.shutdown()
        return None, _next_job_works(hvd)
    failures = (
        _failure(lambda: hvd.synchronize(hvd.allreduce_async(np.ones(2), name="late"))),
        _failure(lambda: hvd.allreduce(np.ones(2), name="later")),
    )
    hvd.shutdown()
    return failures, _next_job_works(hvd)


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_rank_waiting_on_a_departed_peer_fails_then_reinits(tmp_path, transport):
    results = run_ranks(
        _peer_leaves_mid_wait, 2, args=(str(tmp_path / "left"),), env=TRANSPORTS[transport], timeout=45
    )
    for failure in results[0][0]:
        assert failure is not None and failure[1], results[0]
        assert "rank 1" in failure[2] and "shut down" in failure[2], failure
    assert [out for _, out in results] == [[2.0, 2.0], [2.0, 2.0]]


def _diverged(log_path):
    """Rank 0 waits in a barrier, rank 1 in a reducescatter of 'x': neither can complete."""
    import hvdlite as hvd

    if int(os.environ["HVDLITE_RANK"]) == 0:  # capture the coordinator's warnings
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
    hvd.init()
    if hvd.rank() == 0:
        failure = _failure(hvd.barrier)
    else:
        failure = _failure(lambda: hvd.reducescatter(np.ones(4), name="x"))
    hvd.shutdown()
    return failure, _next_job_works(hvd)


def test_diverged_ranks_all_raise_then_reinit_and_the_warning_names_the_mismatch(tmp_path):
    log = str(tmp_path / "rank0.err")
    # Both ranks block, so the deadlock detector would fail them at once (tests/test_deadlock.py);
    # off here, this covers the stall inspector, the way out when it cannot see a deadlock.
    env = {
        "HVDLITE_STALL_CHECK_TIME_SECONDS": "1",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3",
        "HVDLITE_DEADLOCK_CHECK_DISABLE": "1",
    }
    results = run_ranks(_diverged, 2, args=(log,), env=env, timeout=45)
    for failure, out in results:
        assert failure is not None and failure[1], failure  # HvdliteTimeoutError is an internal error
        assert "rank 0 waits in a barrier, rank 1 in reducescatter of 'x'" in failure[2], failure
        assert out == [2.0, 2.0]
    with open(log) as f:
        warnings = f.read()
    assert "rank 0 waits in a barrier, rank 1 in reducescatter of 'x'" in warnings, warnings
