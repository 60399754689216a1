"""Tests of tests/helpers.py itself: results, tracebacks, deaths and timeouts are reported."""

import os
import signal
import time

import pytest
from helpers import run_ranks, spawn_ranks


def _identity():
    keys = (
        "HVDLITE_RANK",
        "HVDLITE_SIZE",
        "HVDLITE_LOCAL_RANK",
        "HVDLITE_LOCAL_SIZE",
        "HVDLITE_CROSS_RANK",
        "HVDLITE_CROSS_SIZE",
        "HVDLITE_STORE_ADDR",
        "HVDLITE_SECRET",
        "OMP_NUM_THREADS",
        "EXTRA",
    )
    return {k: os.environ.get(k) for k in keys}


def _raise_on_rank_1(value):
    if os.environ["HVDLITE_RANK"] == "1":
        raise ValueError("deliberate failure on rank 1")
    return value


def _die(how):
    if os.environ["HVDLITE_RANK"] == "1":
        if how == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGKILL)
    return "survivor"


def _sleep_forever():
    time.sleep(600)


def _big_array():
    import numpy as np

    return np.full(4_000_000, int(os.environ["HVDLITE_RANK"]), dtype=np.int64)


def test_ranks_get_their_identity_and_env_overrides():
    out = run_ranks(_identity, 3, env=lambda r: {"EXTRA": "x%d" % r, "OMP_NUM_THREADS": None})
    assert len({e["HVDLITE_SECRET"] for e in out}) == 1
    assert len(out[0]["HVDLITE_SECRET"]) == 64
    assert len({e["HVDLITE_STORE_ADDR"] for e in out}) == 1
    for rank, e in enumerate(out):
        assert e["HVDLITE_RANK"] == e["HVDLITE_LOCAL_RANK"] == str(rank)
        assert e["HVDLITE_SIZE"] == e["HVDLITE_LOCAL_SIZE"] == "3"
        assert (e["HVDLITE_CROSS_RANK"], e["HVDLITE_CROSS_SIZE"]) == ("0", "1")
        assert e["EXTRA"] == "x%d" % rank and e["OMP_NUM_THREADS"] is None


def test_large_return_values_come_back():
    out = run_ranks(_big_array, 2)
    assert [int(a[-1]) for a in out] == [0, 1] and out[1].size == 4_000_000


def test_run_ranks_reports_the_traceback():
    with pytest.raises(AssertionError) as info:
        run_ranks(_raise_on_rank_1, 2, args=(5,))
    text = str(info.value)
    assert "1 of 2 ranks" in text and "--- rank 1" in text
    assert "ValueError: deliberate failure on rank 1" in text


def test_spawn_ranks_returns_failures():
    res = spawn_ranks(_raise_on_rank_1, 2, args=(5,))
    assert (res[0].exitcode, res[0].value, res[0].traceback) == (0, 5, None)
    assert res[1].exitcode == 1 and res[1].value is None
    assert "deliberate failure" in res[1].traceback


@pytest.mark.parametrize("how,expected", [("exit", "exit code 7"), ("kill", "SIGKILL")])
def test_silent_deaths_are_reported(how, expected):
    res = spawn_ranks(_die, 2, args=(how,))
    assert res[0].value == "survivor"
    assert res[1].exitcode == (7 if how == "exit" else -signal.SIGKILL)
    assert res[1].traceback is None
    with pytest.raises(AssertionError, match=expected):
        run_ranks(_die, 2, args=(how,))


def test_timeout_kills_and_names_the_ranks():
    with pytest.raises(AssertionError, match=r"still running \(now killed\): \[0, 1\]"):
        spawn_ranks(_sleep_forever, 2, timeout=1)


# ---- RankPool: the same contract, processes reused ----


def _allreduce_and_pid(value):
    import numpy as np

    import hvdlite as hvd

    hvd.init()
    total = hvd.allreduce(np.array([value + hvd.rank()], dtype=np.float64), op=hvd.Sum)
    return float(total[0]), os.getpid(), os.environ["HVDLITE_STORE_ADDR"], hvd.is_initialized()


def _left_initialized():
    import hvdlite as hvd

    return hvd.is_initialized()


def test_pool_reuses_processes_and_gives_each_case_a_new_job():
    from helpers import RankPool

    pool = RankPool(2)
    try:
        first = pool.run(_allreduce_and_pid, args=(1.0,))
        second = pool.run(_allreduce_and_pid, args=(10.0,))
        assert [r[0] for r in first] == [3.0, 3.0] and [r[0] for r in second] == [21.0, 21.0]
        assert [r[1] for r in first] == [r[1] for r in second], "the pool started new processes"
        assert first[0][2] != second[0][2], "two cases shared one store"
        assert pool.run(_left_initialized) == [False, False], "a case's init() outlived the case"
        assert pool.run(_identity, env={"EXTRA": "e"})[1]["EXTRA"] == "e"
        assert pool.run(_identity)[1]["EXTRA"] is None, "a case's env outlived the case"
    finally:
        pool.close()


def test_pool_reports_failures_and_timeouts_then_starts_afresh():
    from helpers import RankPool

    pool = RankPool(2)
    try:
        pids = [r[1] for r in pool.run(_allreduce_and_pid, args=(0.0,))]
        with pytest.raises(AssertionError, match="deliberate failure on rank 1"):
            pool.run(_raise_on_rank_1, args=(5,))
        with pytest.raises(AssertionError, match="killed by signal SIGKILL"):
            pool.run(_die, args=("kill",))
        with pytest.raises(
            AssertionError, match=r"timed out after 2 s; ranks still running \(now killed\): \[0, 1\]"
        ):
            pool.run(_sleep_forever, timeout=2)
        again = pool.run(_allreduce_and_pid, args=(0.0,))
        assert [r[0] for r in again] == [1.0, 1.0] and pids != [r[1] for r in again]
        os.kill(again[1][1], signal.SIGKILL)  # a rank dies between cases
        time.sleep(0.5)
        after_kill = pool.run(_allreduce_and_pid, args=(0.0,))
        assert [r[0] for r in after_kill] == [1.0, 1.0] and again[1][1] != after_kill[1][1]
    finally:
        pool.close()
