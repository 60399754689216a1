"""Pipeline schedules as data (hvdlite.parallel.schedules): generated lists pass the checker
for every schedule and size, and the checker rejects broken lists. Pure Python, no ranks."""

import pytest

from hvdlite.parallel import schedules as S
from hvdlite.parallel.schedules import Action, PipelineSchedule, ScheduleError

CONFIGS = [(name, p, m) for name in S.SCHEDULES for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 5, 8)]


def _v(name):
    return 2 if name.startswith("Interleaved") else 1


@pytest.mark.parametrize("name,p,m", CONFIGS)
def test_generated_schedules_pass_the_checker(name, p, m):
    v = _v(name)
    rounds = max(1, m // p)
    if v > 1 and m % rounds:
        with pytest.raises(ScheduleError, match="divisible"):
            S.build(name, p, v, m)
        return
    sched = S.build(name, p, v, m)
    kinds = ("F", "I", "W") if name == "InterleavedZeroBubble" else ("F", "B")
    for kind in kinds:
        for s in range(p * v):
            for mb in range(m):
                holders = [r for r, acts in enumerate(sched.actions) if Action(kind, s, mb) in acts]
                assert holders == [s % p]
    assert S.check(sched)


def test_one_f_one_b_order_and_bubble():
    sched = S.build("1F1B", 4, 1, 8)
    last = [a for a in sched.actions[3] if a.kind in ("F", "B")]
    assert [a.kind for a in last[:4]] == ["F", "B", "F", "B"]
    first = [a.kind for a in sched.actions[0] if a.kind in ("F", "B")]
    assert first[:4] == ["F"] * 4  # warm-up of p-1 forwards, then steady 1F1B
    idle = sched.simulated_idle_fraction()
    assert all(abs(x - 9 / (3 * 8 + 9)) < 1e-9 for x in idle)  # (p-1)(F+B) / makespan
    zb = S.build("InterleavedZeroBubble", 4, 1, 8)
    assert max(zb.simulated_idle_fraction()) < min(idle)


def _sched(actions, p=2, m=1, split=False):
    return PipelineSchedule("test", p, p, m, actions, split, [])


def test_checker_rejects_mismatched_transfer_order():
    # rank 0 sends mb0 then mb1, rank 1 receives mb1 first: blocking send/recv would hang
    acts = [
        [Action("F", 0, 0), Action("F", 0, 1), Action("SEND_F", 0, 0, 1), Action("SEND_F", 0, 1, 1)],
        [Action("RECV_F", 1, 1, 0), Action("RECV_F", 1, 0, 0), Action("F", 1, 0), Action("F", 1, 1)],
    ]
    with pytest.raises(ScheduleError, match="different orders"):
        S.check(_sched(acts, m=2))


def test_checker_finds_a_circular_wait():
    # each rank sends its gradient before it receives the other's activation: a cycle across
    # two pairs needs three ranks; here both ranks wait to send to each other first
    acts = [
        [Action("F", 0, 0), Action("RECV_B", 0, 0, 1), Action("SEND_F", 0, 0, 1), Action("B", 0, 0)],
        [Action("RECV_F", 1, 0, 0), Action("F", 1, 0), Action("B", 1, 0), Action("SEND_B", 1, 0, 0)],
    ]
    with pytest.raises(ScheduleError, match=r"different orders|deadlock"):
        S.check(_sched(acts))


def test_checker_finds_a_deadlock_across_pairs():
    # three ranks, two stages each (stage s on rank s % 3); every pair orders its transfers
    # alike, but each rank first waits for its second stage's input: a circular wait
    F, R, Sd = (
        (lambda s: Action("F", s, 0)),
        (lambda s, q: Action("RECV_F", s, 0, q)),
        (lambda s, q: Action("SEND_F", s, 0, q)),
    )
    acts = [
        [F(0), R(3, 2), Sd(0, 1), F(3), Sd(3, 1)],
        [R(1, 0), F(1), Sd(1, 2), R(4, 0), F(4), Sd(4, 2)],
        [R(2, 1), F(2), Sd(2, 0), R(5, 1), F(5)],
    ]
    with pytest.raises(ScheduleError, match=r"deadlocks.*rank 0 at RECV_F"):
        S.check(PipelineSchedule("test", 3, 6, 1, acts, False, []))


def test_checker_rejects_missing_or_repeated_microbatches():
    sched = S.build("1F1B", 2, 1, 2)
    sched.actions[0] = [a for a in sched.actions[0] if a != Action("B", 0, 1)]
    with pytest.raises(ScheduleError, match="exactly once"):
        S.check(sched)
    sched = S.build("GPipe", 2, 1, 2)
    sched.actions[0].append(Action("F", 0, 0))
    with pytest.raises(ScheduleError, match="exactly once"):
        S.check(sched)


def test_checker_rejects_use_before_arrival():
    acts = [
        [Action("F", 0, 0), Action("SEND_F", 0, 0, 1), Action("RECV_B", 0, 0, 1), Action("B", 0, 0)],
        [Action("F", 1, 0), Action("RECV_F", 1, 0, 0), Action("B", 1, 0), Action("SEND_B", 1, 0, 0)],
    ]
    with pytest.raises(ScheduleError, match="before its input"):
        S.check(_sched(acts))


def test_impossible_configurations_are_clear_errors():
    with pytest.raises(ScheduleError, match="one stage per rank"):
        S.build("1F1B", 2, 2, 4)
    with pytest.raises(ScheduleError, match="at least one"):
        S.build("GPipe", 2, 1, 0)
    with pytest.raises(ScheduleError, match="unknown schedule"):
        S.build("Looped", 2, 1, 2)


def test_zero_bubble_defers_a_bounded_number_of_weight_gradients():
    p = 4
    sched = S.build("InterleavedZeroBubble", p, 1, 8)
    for r, acts in enumerate(sched.actions):
        pending, most = 0, 0
        for a in acts:
            pending += {"I": 1, "W": -1}.get(a.kind, 0)
            most = max(most, pending)
        assert most <= p - r  # at most p-1-r deferred, plus the one just produced


def test_exchanges_are_fused_alike_on_both_ranks():
    sched = S.build("1F1B", 4, 1, 8)
    assert any(a.fused for acts in sched.actions for a in acts)  # some steady-state pairs fuse
    r, i = next((r, i) for r, acts in enumerate(sched.actions) for i, a in enumerate(acts) if a.fused)
    sched.actions[r][i] = sched.actions[r][i]._replace(fused=False)
    with pytest.raises(ScheduleError, match="different orders"):
        S.check(sched)
    sched = S.build("GPipe", 2, 1, 2)
    i = next(i for i, a in enumerate(sched.actions[0]) if a.kind == "SEND_F")
    sched.actions[0][i] = sched.actions[0][i]._replace(fused=True)
    with pytest.raises(ScheduleError, match="must be followed by the opposite transfer"):
        S.check(sched)
