"""Bad input and faults: every rank gets a clear error, never a hang."""

import os
import time

import numpy as np
import pytest
from helpers import run_ranks, spawn_ranks


def _mismatches():
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    odd = r == 2
    cases = {
        "shape": lambda: hvd.allreduce(np.ones(4 if odd else 3, np.float32), name="m.shape"),
        "dtype": lambda: hvd.allreduce(np.ones(3, np.float64 if odd else np.float32), name="m.dtype"),
        "op": lambda: hvd.allreduce(np.ones(3), op=hvd.Max if odd else hvd.Sum, name="m.op"),
        "root": lambda: hvd.broadcast(np.ones(3), root_rank=1 if odd else 0, name="m.root"),
        "kind": lambda: (hvd.allgather if odd else hvd.allreduce)(np.ones(3), name="m.kind"),
        "gather_tail": lambda: hvd.allgather(np.ones((2, 3 + odd)), name="m.tail"),
    }
    errors = {}
    for case, call in cases.items():
        try:
            call()
            errors[case] = None
        except hvd.HvdliteError as e:
            errors[case] = (type(e).__name__, str(e))
        # the job carries on normally after each error
        assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="after." + case).tolist() == [3.0, 3.0]
    hvd.shutdown()
    return errors


def test_mismatched_inputs_raise_on_every_rank_naming_tensor_and_ranks():
    results = run_ranks(_mismatches, 3, timeout=60)
    names = {
        "shape": "m.shape",
        "dtype": "m.dtype",
        "op": "m.op",
        "root": "m.root",
        "kind": "m.kind",
        "gather_tail": "m.tail",
    }
    for errors in results:
        for case, tensor in names.items():
            assert errors[case] is not None, case
            kind, message = errors[case]
            assert kind == "MismatchError", (case, kind, message)
            assert "'%s'" % tensor in message
            assert "rank 2" in message and "ranks 0, 1" in message, message
    assert "float64" in results[0]["dtype"][1] and "float32" in results[0]["dtype"][1]


def _bad_local_input():
    import hvdlite as hvd

    hvd.init()
    out = {}
    if hvd.rank() == 1:
        time.sleep(0.5)  # keeps rank 0's first 'dup' in flight while it submits the second
    h = hvd.allreduce_async(np.ones(3), name="dup")
    if hvd.rank() == 1:
        # Rank 0's 'dup' waited for this one: the operation completes in the core now, but
        # its handle is not synchronized, so the name is still taken.
        time.sleep(0.5)
    try:
        hvd.allreduce_async(np.ones(3), name="dup")
    except hvd.PreconditionError as e:
        out["duplicate"] = str(e)
    hvd.synchronize(h)
    for case, call in {
        "dtype": lambda: hvd.allreduce(np.ones(3, np.complex64), name="c64"),
        "bad_root": lambda: hvd.broadcast(np.ones(3), root_rank=5, name="root5"),
        "splits": lambda: hvd.alltoall(np.ones((4, 1)), splits=[1, 1], name="sp"),
        "uneven": lambda: hvd.alltoall(np.ones((3, 1)), name="uneven"),
        "bool_sum": lambda: hvd.allreduce(np.ones(3, bool), name="boolsum"),
        "adasum": lambda: hvd.allreduce(np.ones(3, np.int32), op=hvd.Adasum, name="ada"),  # floats only
    }.items():
        try:
            call()
            out[case] = None
        except hvd.HvdliteError as e:
            out[case] = (type(e).__name__, str(e))
    out["after"] = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after").tolist()
    hvd.shutdown()
    return out


def test_bad_local_input_is_a_clear_error():
    results = run_ranks(_bad_local_input, 2, timeout=60)
    for out in results:  # rank 1's first 'dup' had completed, unsynchronized
        assert "already in flight" in out["duplicate"] and "'dup'" in out["duplicate"]
    for out in results:
        assert out["dtype"][0] == "NotSupportedError" and "complex64" in out["dtype"][1]
        assert out["bad_root"][0] == "InvalidArgumentError" and "root rank 5" in out["bad_root"][1]
        assert out["splits"][0] == "InvalidArgumentError" and "splits" in out["splits"][1]
        assert out["uneven"][0] == "InvalidArgumentError" and "divisible" in out["uneven"][1]
        assert out["bool_sum"][0] == "NotSupportedError"
        assert out["adasum"][0] == "NotSupportedError"
        assert out["after"] == [2.0, 2.0]


def _one_rank_dies(how):
    import hvdlite as hvd

    hvd.init()
    hvd.allreduce(np.ones(2), name="warmup")
    if hvd.rank() == 2:
        time.sleep(0.5)  # let the others submit first: their pending op must fail too
        if how == "kill":
            os.kill(os.getpid(), 9)
        os._exit(0)  # exits without shutdown() and without atexit handlers
    pending = hvd.allreduce_async(np.ones(2), name="pending")
    try:
        hvd.synchronize(pending)
        first = None
    except hvd.HvdliteInternalError as e:
        first = str(e)
    try:
        hvd.allreduce(np.ones(2), name="later")
        later = None
    except hvd.HvdliteInternalError as e:
        later = str(e)
    hvd.shutdown()
    return first, later


def _check_dead_rank_reported(results):
    assert results[2].exitcode != 1  # died on purpose, not through an assertion
    for res in results[:2]:
        assert res.traceback is None, res.traceback
        first, later = res.value
        assert first is not None and "rank 2" in first, first
        assert later is not None


def test_killed_rank_fails_pending_and_later_ops_on_the_others():
    _check_dead_rank_reported(spawn_ranks(_one_rank_dies, 3, args=("kill",), timeout=60))


def test_rank_exiting_without_shutdown_fails_the_others():
    _check_dead_rank_reported(spawn_ranks(_one_rank_dies, 3, args=("exit",), timeout=60))


def _leaves_early(leaver=1, linger=0.0):
    """`leaver` returns at once; the others fail their next allreduce, then (after `linger`
    seconds, so that every rank's request reaches the coordinator first) shut down."""
    import hvdlite as hvd

    hvd.init()
    if hvd.rank() == leaver:
        return "left"  # returns without shutdown(): the atexit handler shuts down
    time.sleep(0.5)
    try:
        hvd.allreduce(np.ones(2), name="after-exit")
        return None
    except hvd.HvdliteInternalError as e:
        return str(e)
    finally:
        time.sleep(linger)
        hvd.shutdown()


def test_rank_that_returns_early_is_reported_as_shut_down():
    results = run_ranks(_leaves_early, 2, timeout=60)
    assert results[1] == "left"
    assert results[0] is not None and "rank 1" in results[0], results[0]


# 6 ranks: negotiation is relayed along the vote tree (0 -> 4 -> 5, 0 -> 2 -> 3). Whether
# the rank that leaves is the coordinator or a relay (4, rank 5's way to rank 0), every
# other rank gets an error naming it.
@pytest.mark.slow
@pytest.mark.parametrize("leaver", [0, 4])
def test_coordinator_or_relay_that_returns_early_is_reported_to_every_rank(leaver):
    results = run_ranks(_leaves_early, 6, args=(leaver, 1.0), timeout=120)
    assert results[leaver] == "left"
    for rank, error in enumerate(results):
        if rank != leaver:
            assert error is not None and "rank %d" % leaver in error, (rank, error)


def _stall(log_path):
    import hvdlite as hvd

    if hvd_rank_env() == 0:  # capture the coordinator's warnings
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
    hvd.init()
    if hvd.rank() == 1:
        time.sleep(4)  # never submits 'stalled'
        hvd.allreduce(np.ones(1), name="resync")
        hvd.shutdown()
        return None
    try:
        hvd.allreduce(np.ones(1), name="stalled")
        result = None
    except hvd.HvdliteTimeoutError as e:
        result = str(e)
    hvd.allreduce(np.ones(1), name="resync")
    hvd.shutdown()
    return result


def hvd_rank_env():
    return int(os.environ["HVDLITE_RANK"])


def test_stalled_rank_is_warned_about_then_failed(tmp_path):
    log = str(tmp_path / "rank0.err")
    env = {"HVDLITE_STALL_CHECK_TIME_SECONDS": "1", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "2.5"}
    results = run_ranks(_stall, 2, args=(log,), env=env, timeout=60)
    assert results[0] is not None and "'stalled'" in results[0] and "ranks 1" in results[0], results[0]
    with open(log) as f:
        warnings = f.read()
    assert "Stalled tensor 'stalled'" in warnings and "ranks 1" in warnings, warnings
