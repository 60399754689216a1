"""Steady state (HVDLITE_STEADY_STATE, coordinator/steady_state.h): once every rank has
submitted the same named tensors in the same order twice, they run without the round trip
to rank 0 (ranks vote ready/exit to each other), and any change falls back to negotiation.
The runtime's ``scheduled_responses`` counter proves the fast path ran; the fallbacks must
give the same results and errors as negotiation. Real processes (helpers.run_ranks)."""

import numpy as np
import pytest
from helpers import run_pooled, run_ranks

NAMES = ["w0", "w1", "w2", "w3"]
STEPS = 40


def _step(hvd, it, names=NAMES, order=None, shapes=None, dtypes=None):
    """One training step: every tensor of `names` submitted (in `order`), then waited for;
    returns the results by name."""
    r = hvd.rank()
    order = order or names
    handles = {}
    for name in order:
        n = (shapes or {}).get(name, 3 + names.index(name) if name in names else 5)
        dtype = (dtypes or {}).get(name, np.float32)
        handles[name] = hvd.allreduce_async(np.full(n, r + it, dtype), name=name, op=hvd.Sum)
    return {name: hvd.synchronize(handles[name]) for name in order}


def _expect(hvd, it):
    return sum(k + it for k in range(hvd.size()))


def _loop(fused):
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    for it in range(STEPS):
        if fused:
            out = _step(hvd, it)
        else:  # one tensor at a time: every response carries one tensor
            out = {
                n: hvd.allreduce(np.full(3, float(hvd.rank() + it), np.float32), name=n, op=hvd.Sum)
                for n in NAMES
            }
        for name, value in out.items():
            assert (value == _expect(hvd, it)).all(), (it, name, value)
    stats = runtime_stats()
    hvd.shutdown()
    return stats


# Learning needs two steps decided alike (three at best: the first sighting is not cached);
# how submissions fuse while it learns depends on timing, so allow it a few more.
LEARN_STEPS = 10


def _assert_mostly_scheduled(stats, responses_per_step, steps=STEPS - LEARN_STEPS):
    """Every step after learning ran without the coordinator (a step is at least
    `responses_per_step` responses)."""
    assert stats["scheduled_responses"] >= responses_per_step * steps, stats


# 6 ranks: the vote tree has two levels below rank 0 (0 -> 4 -> 5, 0 -> 2 -> 3).
@pytest.mark.parametrize("size", [2, 3, pytest.param(6, marks=pytest.mark.slow)])
@pytest.mark.parametrize("fused", [True, False])
def test_loop_runs_scheduled(size, fused):
    for stats in run_pooled(_loop, size, args=(fused,), timeout=120):
        assert stats["allreduce_tensors"] == STEPS * len(NAMES), stats
        _assert_mostly_scheduled(stats, 1 if fused else len(NAMES))


def test_loop_runs_scheduled_over_tcp():
    # The votes travel on the TCP control plane instead of shared memory.
    for stats in run_pooled(_loop, 2, args=(True,), env={"HVDLITE_SHM_DISABLE": "1"}, timeout=120):
        _assert_mostly_scheduled(stats, 1)


def test_loop_with_setting_off_never_schedules():
    runs = run_pooled(_loop, 2, args=(True,), env={"HVDLITE_STEADY_STATE": "0"}, timeout=120)
    for stats in runs:
        assert stats["scheduled_responses"] == 0, stats


# Dtypes that make three responses per step (float32 tensors fuse; the others do not).
DTYPES = {"w0": np.float32, "w1": np.float64, "w2": np.int32, "w3": np.float32}


def _voted_inputs(rank):
    """This rank's inputs to _voted: four small float32 tensors by name, a float64 one (its
    own response: another dtype) and a 160 KB one (the ring: never voted)."""
    rng = np.random.default_rng(1234 + rank)
    small = {n: rng.standard_normal(5 + 97 * k).astype(np.float32) for k, n in enumerate(NAMES)}
    return small, rng.standard_normal(1000), rng.standard_normal(40000).astype(np.float32)


def _voted(steps):
    """Small allreduces (fused and alone, with scales, Average and Max) of the same random
    inputs every step: the first steps negotiate and run the backend's recursive doubling,
    the later ones reduce the inputs the votes carried. Returns (the distinct results per
    name, as bytes; runtime stats)."""
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    small, alone, large = _voted_inputs(hvd.rank())
    seen = {}
    for _ in range(steps):
        handles = {
            n: hvd.allreduce_async(v, name=n, op=hvd.Sum, prescale_factor=0.5) for n, v in small.items()
        }
        handles["alone"] = hvd.allreduce_async(alone, name="alone", op=hvd.Average, postscale_factor=3.0)
        handles["large"] = hvd.allreduce_async(large, name="large", op=hvd.Max)
        for n, h in handles.items():
            seen.setdefault(n, set()).add(hvd.synchronize(h).tobytes())
    stats = runtime_stats()
    hvd.shutdown()
    return seen, stats


@pytest.mark.parametrize(
    "size,env",
    [(2, {}), (3, {}), (2, {"HVDLITE_SHM_DISABLE": "1"}), pytest.param(6, {}, marks=pytest.mark.slow)],
)
def test_small_allreduces_reduce_the_inputs_votes_carried(size, env):
    runs = run_pooled(_voted, size, args=(STEPS,), env=env, timeout=120)
    for seen, stats in runs:
        assert stats["voted_responses"] >= STEPS - LEARN_STEPS, stats  # the small groups
        assert stats["voted_responses"] <= stats["scheduled_responses"] - (STEPS - LEARN_STEPS), stats
        # The same bits whether negotiated (backend) or voted (local tree), on every rank.
        assert all(len(results) == 1 for results in seen.values()), {n: len(r) for n, r in seen.items()}
        assert seen == runs[0][0]
    got = {
        n: np.frombuffer(next(iter(r)), np.float64 if n == "alone" else np.float32)
        for n, r in runs[0][0].items()
    }
    inputs = [_voted_inputs(r) for r in range(size)]
    for n in NAMES:
        np.testing.assert_allclose(
            got[n], sum(0.5 * small[n] for small, _, _ in inputs), rtol=1e-5, atol=1e-6
        )
    np.testing.assert_allclose(got["alone"], 3.0 * sum(alone for _, alone, _ in inputs) / size, rtol=1e-12)
    np.testing.assert_array_equal(got["large"], np.max([large for _, _, large in inputs], 0))


def _with_barriers(steps):
    """A loop that calls barrier() before every step (as a benchmark's repetitions do),
    one step also with an allreduce in flight across the barrier."""
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    for it in range(steps):
        hvd.barrier()
        for value in _step(hvd, it).values():
            assert (value == _expect(hvd, it)).all(), (it, value)
    handle = hvd.allreduce_async(np.full(3, 1.0, np.float32), name="across", op=hvd.Sum)
    hvd.barrier()
    assert (hvd.synchronize(handle) == hvd.size()).all()
    stats = runtime_stats()
    hvd.shutdown()
    return stats


@pytest.mark.parametrize("size", [2, 3])
def test_barriers_between_steps_stay_in_schedule_mode(size):
    for stats in run_pooled(_with_barriers, size, args=(STEPS,), timeout=120):
        # every step after learning, and the barrier before it, ran without the coordinator
        _assert_mostly_scheduled(stats, 2)


def _orders(changing):
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    for it in range(STEPS):
        if changing:  # every rank in its own order, changing every step
            shift = (hvd.rank() + it) % len(NAMES)
        else:  # one order while the schedule is learned, then each rank its own
            shift = 0 if it < 2 * LEARN_STEPS else hvd.rank() + 1
        order = NAMES[shift:] + NAMES[:shift]
        for name, value in _step(hvd, it, order=order, dtypes=DTYPES).items():
            assert (value == _expect(hvd, it)).all(), (it, name, value)
    stats = runtime_stats()
    hvd.shutdown()
    return stats


@pytest.mark.parametrize("changing", [False, True])
def test_different_submission_orders_complete(changing):
    for stats in run_pooled(_orders, 3, args=(changing,), timeout=120):
        assert stats["allreduce_tensors"] == STEPS * len(NAMES), stats
        if not changing:
            # Out of order within a step waits for the rest of the group: no fallback.
            _assert_mostly_scheduled(stats, 3, steps=STEPS - 2 * LEARN_STEPS)


def _changed_shape(k):
    import hvdlite as hvd

    hvd.init()
    error = None
    for it in range(k + 1):
        shapes = {"w1": 9} if it == k and hvd.rank() == 1 else None
        try:
            _step(hvd, it, shapes=shapes)
        except hvd.MismatchError as e:  # hvdlite's Mismatch family
            error = str(e)
    hvd.shutdown()
    return error


def test_changed_shape_gives_the_negotiation_error():
    on = run_pooled(_changed_shape, 2, args=(12,), timeout=120)
    off = run_pooled(_changed_shape, 2, args=(12,), env={"HVDLITE_STEADY_STATE": "0"}, timeout=120)
    assert on[0] is not None and "w1" in on[0], on
    assert on == off


def _new_and_skipped():
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    for it in range(STEPS):
        names = list(NAMES)
        if it == 10:
            names.append("extra")  # a new tensor mid-loop
        if it in (20, 21):
            names.remove("w2")  # a skipped tensor
        for name, value in _step(hvd, it, names=names).items():
            assert (value == _expect(hvd, it)).all(), (it, name, value)
    stats = runtime_stats()
    hvd.shutdown()
    return stats


def test_new_and_skipped_tensors_fall_back_and_finish():
    for stats in run_pooled(_new_and_skipped, 2, timeout=120):
        assert stats["scheduled_responses"] > 0, stats  # it re-learned after each change
        assert stats["allreduce_tensors"] == STEPS * len(NAMES) + 1 - 2, stats


def _mixed():
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    r, size = hvd.rank(), hvd.size()
    pair = hvd.add_process_set([0, 1])
    for it in range(STEPS):
        for name, value in _step(hvd, it).items():
            assert (value == _expect(hvd, it)).all(), (it, name, value)
        if it % 7 == 3:
            hvd.barrier()
        if it % 5 == 0:
            b = hvd.broadcast(np.full(2, float(r + it)), root_rank=1, name="bc")
            assert (b == 1 + it).all(), b
            g = hvd.allgather(np.full((1, 2), float(r)), name="ag")
            assert g[:, 0].tolist() == [float(k) for k in range(size)], g
        if it % 9 == 4 and r in (0, 1):
            p = hvd.allreduce(np.ones(3), name="pair", op=hvd.Sum, process_set=pair)
            assert (p == 2).all(), p
    # Uneven data: rank 0 runs two more steps while the others have joined.
    if r == 0:
        for _ in range(2):
            out = hvd.allreduce(np.full(3, 1.0), name=NAMES[0], op=hvd.Sum)
            assert (out == 1).all(), out
    last = hvd.join()
    stats = runtime_stats()
    hvd.shutdown()
    return last, stats


def test_join_barrier_process_sets_and_other_collectives_mixed_in():
    runs = run_pooled(_mixed, 3, timeout=180)
    assert all(last == 0 for last, _ in runs), runs
    for _, stats in runs:
        assert stats["scheduled_responses"] > 0, stats


def _idle_cpu():
    import time

    import hvdlite as hvd

    hvd.init()
    for it in range(STEPS):
        _step(hvd, it)
    # Idle in schedule mode: the engine sleeps in the transport.
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(2.0)
    cpu = time.process_time() - cpu0
    wall = time.monotonic() - wall0
    _step(hvd, STEPS)
    hvd.shutdown()
    return cpu / wall


def test_idle_rank_uses_under_one_percent_cpu():
    for ratio in run_pooled(_idle_cpu, 2, timeout=120):
        assert ratio < 0.01, ratio


def _stalled():
    import re
    import time

    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    for it in range(STEPS):
        _step(hvd, it)
    scheduled = runtime_stats()["scheduled_responses"]
    error = None
    if hvd.rank() == hvd.size() - 1:
        time.sleep(4)  # never submits the next step: rank 0's wait must end in the stall error
    else:
        try:
            _step(hvd, STEPS)
        except hvd.HvdliteTimeoutError as e:
            error = re.sub(r"\d+ s", "N s", str(e))
    hvd.shutdown()
    return error, scheduled


# With 6 ranks the idle rank (5) is a leaf two levels down the vote tree: its parent's
# stall notice must wake it so that it votes exit and the job falls back to negotiation.
# Slow, both sizes (~8 s at 2 ranks): a failure path whose timeout dominates.
@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 6])
def test_rank_that_never_votes_gets_the_stall_error(size):
    env = {"HVDLITE_STALL_CHECK_TIME_SECONDS": "1", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "2.5"}
    on = run_pooled(_stalled, size, env=env, timeout=120)
    off = run_pooled(_stalled, size, env=dict(env, HVDLITE_STEADY_STATE="0"), timeout=120)
    assert on[0][1] > 0 and off[0][1] == 0, (on, off)  # the stall began in schedule mode
    assert on[0][0] is not None and "stalled" in on[0][0] and "ranks %d" % (size - 1) in on[0][0], on
    assert on[0][0] == off[0][0], (on, off)


def _hung_peer():
    import os
    import signal

    import hvdlite as hvd

    hvd.init()
    pids = hvd.allgather(np.array([os.getpid()], np.int64), name="pids")
    for it in range(STEPS):
        _step(hvd, it)
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # a hung process: rank 0 sends SIGCONT once it failed
        # Rank 0's ready vote for the first position may have carried its input (small
        # allreduces reduce from the votes), so that position can still complete here;
        # the next one needs rank 0, which has stopped.
        error = None
        for it in range(STEPS, STEPS + 3):
            try:
                _step(hvd, it)
            except hvd.HvdliteError as e:
                error = str(e)
                break
        return error
    error = None
    try:
        _step(hvd, STEPS)
    except hvd.HvdliteTimeoutError as e:
        error = str(e)
    finally:
        os.kill(int(pids[1]), signal.SIGCONT)
    hvd.shutdown()
    return error


def test_hung_peer_in_schedule_mode_fails_after_the_timeout():
    env = {"HVDLITE_TIMEOUT_SECONDS": "2"}
    errors = run_ranks(_hung_peer, 2, env=env, timeout=120)
    assert errors[0] is not None and "sent no steady-state vote" in errors[0] and "ranks 1" in errors[0], (
        errors
    )
    assert errors[1] is not None, errors  # the job is over for rank 1 too
