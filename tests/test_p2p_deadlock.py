"""The deadlock detector knows point-to-point waits (issue 31; coordinator/deadlock.h).

A caller blocked in a recv whose source is itself blocked in something that needs this rank
first (a recv of its own, a collective the receiver never joins) fails with a MismatchError
naming the unmatched (rank, tag) pair, the process set and the fix, on the waiting rank. The
point-to-point timeout is set to 120 s and the stall times to 600 s, above the test's own
timeout, so only the deadlock detector can end these cases; no wall time is asserted. A
source that is slow but not blocked is never reported.
"""

import time

import numpy as np
import pytest
from helpers import run_pooled

LONG_WAITS = {
    "HVDLITE_TIMEOUT_SECONDS": "120",
    "HVDLITE_STALL_CHECK_TIME_SECONDS": "600",
    "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "600",
}


def _failure(call):
    import hvdlite

    try:
        call()
        return None
    except hvdlite.HvdliteError as e:
        return type(e).__name__, str(e)


def _deadlocks():
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    peer = 1 - r
    out = {}
    # 1. Both ranks receive first: neither send can ever be posted.
    out["exchange"] = _failure(lambda: hvd.recv(np.zeros(2), peer, tag=7, name="act"))
    # 2. Rank 0 receives from rank 1, which waits in an allreduce rank 0 never joins.
    if r == 0:
        out["vs_collective"] = _failure(lambda: hvd.recv(np.zeros(2), 1, tag=3, name="grad"))
    else:
        out["vs_collective"] = _failure(lambda: hvd.allreduce(np.ones(2), name="only1"))
    # 3. The job goes on: a correct exchange, then a slow (computing, not blocked) sender.
    got = np.zeros(2)
    h = hvd.send_async(np.full(2, float(r)), peer, tag=8)
    hvd.recv(got, peer, tag=8)
    hvd.synchronize(h)
    out["after"] = got.tolist()
    if r == 0:
        slow = np.zeros(2)
        hvd.recv(slow, 1, tag=9)
        out["slow"] = slow.tolist()
    else:
        time.sleep(1.0)  # past the wait report delay: rank 0 is reported blocked meanwhile
        hvd.send(np.full(2, 5.0), 0, tag=9)
    hvd.shutdown()
    return out


def test_deadlocked_recv_names_the_pair_and_the_fix():
    res = run_pooled(_deadlocks, 2, timeout=60, env=LONG_WAITS)
    for r, out in enumerate(res):
        kind, msg = out["exchange"]
        assert kind == "MismatchError", out
        assert msg.startswith("deadlock: "), msg
        assert f"recv of tensor 'act' from rank {1 - r} with tag 7 in the global process set" in msg, msg
        assert "post every send a peer waits for" in msg, msg
        assert out["after"] == [float(1 - r)] * 2
    kind, msg = res[0]["vs_collective"]
    assert kind == "MismatchError", res[0]
    assert "rank 0 waits in recv of tensor 'grad' from rank 1 with tag 3" in msg, msg
    assert "rank 1 waits in allreduce 'only1'" in msg, msg
    assert res[1]["vs_collective"][0] == "MismatchError", res[1]
    assert res[0]["slow"] == [5.0, 5.0]


def _in_a_process_set():
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    pair = hvd.add_process_set([1, 2])
    out = None
    if r == 0:
        time.sleep(2.0)  # computing, not blocked: only ranks 1 and 2 are deadlocked
    else:
        out = _failure(lambda: hvd.recv(np.zeros(3), 2 - r, tag=5, name="x", process_set=pair))
    hvd.remove_process_set(pair)
    hvd.shutdown()
    return out


@pytest.mark.slow
def test_deadlocked_recv_in_a_process_set_names_both_ranks():
    res = run_pooled(_in_a_process_set, 3, timeout=60, env=LONG_WAITS)
    assert res[0] is None
    for r in (1, 2):
        kind, msg = res[r]
        assert kind == "MismatchError", res[r]
        src = 3 - r
        assert f"recv of tensor 'x' from rank {src} (rank {src - 1} of process set" in msg, msg
        assert "with tag 5 in that set" in msg, msg
