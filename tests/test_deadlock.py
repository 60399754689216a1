"""A deadlock is reported at once, on every rank (issue 9).

When every rank of a job is blocked in synchronize() and nothing any of them waits for can
ever complete (rank 0 waits in allreduce 'a' that only it submitted, rank 1 in 'b'), the
coordinator fails those operations on every rank with a MismatchError naming who waits for
what, instead of after the stall shutdown time. The stall times here are 600 s, so only the
deadlock detector can end these tests within their timeouts; no wall time is asserted.
A rank that is merely slow (still computing, or holding pending handles without blocking)
is never reported.
"""

import time

import numpy as np
import pytest
from helpers import run_ranks

STALL_ENV = {"HVDLITE_STALL_CHECK_TIME_SECONDS": "600", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "600"}


def _failure(call):
    import hvdlite

    try:
        call()
        return None
    except Exception as e:
        return type(e).__name__, isinstance(e, hvdlite.MismatchError), str(e)


def _numpy_deadlock(kind):
    """Both ranks block on collectives nobody else submits, then start a clean job."""
    import hvdlite as hvd

    hvd.init()
    hvd.allreduce(np.ones(2), name="warmup")
    r = hvd.rank()
    if kind == "names":
        failure = _failure(lambda: hvd.allreduce(np.ones(3), name="a" if r == 0 else "b"))
    elif kind == "barrier":
        failure = _failure(hvd.barrier if r == 0 else lambda: hvd.reducescatter(np.ones(4), name="x"))
    else:  # a grouped wait on rank 0: one of its tensors can never complete
        if r == 0:
            handles = [hvd.allreduce_async(np.ones(2), name=n) for n in ("shared", "only0")]
            failure = _failure(lambda: [hvd.synchronize(h) for h in handles])
        else:
            handle = hvd.allreduce_async(np.ones(2), name="only1")
            hvd.allreduce_async(np.ones(2), name="shared")
            failure = _failure(lambda: hvd.synchronize(handle))
    hvd.shutdown()
    hvd.init()
    after = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after").tolist()
    hvd.shutdown()
    return failure, after


def _check(results, *parts):
    for failure, after in results:
        assert failure is not None, results
        _, mismatch, message = failure
        assert mismatch, failure  # hvdlite.MismatchError, on every rank
        assert message.startswith("deadlock: "), message
        for part in parts:
            assert part in message, message
        assert "no operation can complete" in message and "Fix:" in message, message
        assert after == [2.0, 2.0]


def test_ranks_waiting_for_different_names_all_raise_then_reinit():
    results = run_ranks(_numpy_deadlock, 2, args=("names",), env=STALL_ENV, timeout=60)
    _check(
        results,
        "rank 0 waits in allreduce 'a' (submitted by ranks [0])",
        "rank 1 waits in allreduce 'b' (submitted by ranks [1])",
    )


def test_barrier_against_reducescatter_is_a_deadlock():
    results = run_ranks(_numpy_deadlock, 2, args=("barrier",), env=STALL_ENV, timeout=60)
    _check(results, "rank 0 waits in a barrier", "rank 1 waits in reducescatter 'x'")


def test_grouped_wait_with_one_impossible_tensor_is_a_deadlock():
    results = run_ranks(_numpy_deadlock, 2, args=("group",), env=STALL_ENV, timeout=60)
    _check(results, "rank 0 waits in allreduce 'only0'", "rank 1 waits in allreduce 'only1'")


def _torch_deadlock():
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    if r == 0:
        failure = _failure(lambda: hvd.allreduce(torch.ones(3), name="t.a"))
    else:
        failure = _failure(lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(3)], name="t.g"))
    hvd.shutdown()
    hvd.init()
    after = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist()
    hvd.shutdown()
    return failure, after


def test_torch_ranks_in_different_collectives_all_raise_then_reinit():
    results = run_ranks(_torch_deadlock, 2, env=STALL_ENV, timeout=60)
    _check(
        results,
        "rank 0 waits in allreduce 'allreduce.t.a' (submitted by ranks [0])",  # Horovod's torch names
        "rank 1 waits in allreduce 'allreduce.t.g",
    )


def _three_ranks():
    """Ranks 0 and 1 deadlock while rank 2 computes; then all three meet in a barrier."""
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    if r == 2:
        time.sleep(5.0)  # computing: not blocked, so not part of the deadlock
        failure = None
    else:
        failure = _failure(lambda: hvd.allreduce(np.ones(2), name="p" if r == 0 else "q"))
    hvd.barrier()
    hvd.shutdown()
    return failure


# Slow (3 ranks, ~5 s): the 2-rank deadlock cases stay in the default suite.
@pytest.mark.slow
def test_two_of_three_ranks_deadlock_while_the_third_computes():
    """'p' needs rank 1 and 'q' rank 0 whatever rank 2 does: reported without rank 2."""
    results = run_ranks(_three_ranks, 3, env=STALL_ENV, timeout=60)
    assert results[2] is None
    for failure in results[:2]:
        assert failure is not None and failure[1], failure
        assert "rank 0 waits in allreduce 'p'" in failure[2] and "rank 1 waits in allreduce 'q'" in failure[2]


def _slow_ranks():
    """No deadlock: rank 1 computes for 3 s before submitting; then rank 0 holds a pending
    handle without blocking while rank 1 blocks on another."""
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    if r == 1:
        time.sleep(3.0)
    first = hvd.allreduce(np.ones(2), op=hvd.Sum, name="slow").tolist()
    if r == 0:
        ha = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="a")
        time.sleep(2.0)  # pending, not blocked: rank 1 blocks on 'b' meanwhile
        hb = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="b")
        second = [hvd.synchronize(ha).tolist(), hvd.synchronize(hb).tolist()]
    else:
        b = hvd.allreduce(np.ones(2), op=hvd.Sum, name="b").tolist()
        second = [hvd.allreduce(np.ones(2), op=hvd.Sum, name="a").tolist(), b]
    hvd.shutdown()
    return first, second


def test_slow_ranks_are_not_a_deadlock():
    results = run_ranks(_slow_ranks, 2, env=STALL_ENV, timeout=60)
    assert results == [([2.0, 2.0], [[2.0, 2.0], [2.0, 2.0]])] * 2


def _process_sets():
    """The same name in two process sets is two collectives: rank 0 waits in one, rank 1 in
    the other."""
    import hvdlite as hvd

    hvd.init()
    pair = hvd.add_process_set([0, 1], allow_duplicate=True)  # the same ranks as the global set
    r = hvd.rank()
    chosen = pair if r == 0 else hvd.global_process_set
    failure = _failure(lambda: hvd.allreduce(np.ones(2), name="same", process_set=chosen))
    after = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after", process_set=pair).tolist()
    hvd.shutdown()
    return failure, after


def test_same_name_in_different_process_sets_is_a_deadlock():
    results = run_ranks(_process_sets, 2, env=STALL_ENV, timeout=60)
    for failure, after in results:
        assert failure is not None and failure[1], failure
        assert "rank 0 waits in allreduce 'same' of process set 1 (submitted by ranks [0])" in failure[2]
        assert "rank 1 waits in allreduce 'same' (submitted by ranks [1])" in failure[2]
        assert after == [2.0, 2.0]
