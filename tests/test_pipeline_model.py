"""benchmarks/_pipeline_model.py: the replay of a schedule's action lists gives the generated
schedule's own idle fraction when transfers are free, and more as they cost more; the costs
read from timelines are the ones written into them."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import _pipeline_model as model

from hvdlite.parallel import schedules

CASES = [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("InterleavedZeroBubble", 2)]


@pytest.mark.parametrize("kind,v", CASES)
def test_free_transfers_replay_to_the_generated_idle(kind, v):
    schedule = schedules.build(kind, 4, v, 8)
    want = sum(schedule.simulated_idle_fraction()) / 4
    assert model.replay(schedule, 10.0) == pytest.approx(want, abs=1e-9)
    # B = 2F: an overrun of one F-unit's tenth on F and B alike barely moves the idle
    assert model.replay(schedule, 10.0, overrun_ms=0.1) == pytest.approx(want, abs=0.01)


@pytest.mark.parametrize("kind,v", CASES)
def test_costlier_transfers_idle_more(kind, v):
    schedule = schedules.build(kind, 4, v, 8)
    idles = [model.replay(schedule, 10.0, 0.0, cost / 2, cost) for cost in (0.0, 0.1, 0.5, 2.0)]
    assert idles == sorted(idles) and idles[-1] > idles[0] + 0.01


def test_hop_costs_read_from_timelines():
    A = schedules.Action
    # rank 0 sends microbatch 0 forward at t=20 ms (posting takes 0.2 ms); rank 1 waits from
    # t=5 ms and has it at 20.5 ms: a hop of 0.3 ms after the post ended
    rank0 = [(A("F", 0, 0), 0.000, 0.0105), (A("SEND_F", 0, 0, 1), 0.0200, 0.0202)]
    rank1 = [(A("RECV_F", 1, 0, 0), 0.0050, 0.0205), (A("F", 1, 0), 0.0205, 0.0315)]
    overrun, post, hop = model.hop_costs([[rank0], [rank1]], 10.0, 1)
    assert overrun == pytest.approx(0.75)  # medians of 0.5 and 1.0 ms
    assert post == pytest.approx(0.2)
    assert hop == pytest.approx(0.3)
