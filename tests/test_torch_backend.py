"""torch.distributed on the "hvdlite" backend (hvdlite/torch_backend/): every collective equals
gloo's result in the same job, subgroups become process sets among their members, divergent
ranks get an error and the group stays usable, a dead peer fails the survivors' calls, and the
job forms under hvdliterun's variables or through torch's own store. Model-level equivalence
(DDP, FSDP2, TP, pipelining) is in tests/test_torch_backend_models.py."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch_backend_cases as cases
from helpers import run_pooled, run_ranks, spawn_ranks

from hvdlite.common import job


def _check_all_true(results):
    for rank, out in enumerate(results):
        assert out.pop("backend") == "hvdlite"
        wrong = sorted(k for k, v in out.items() if v is not True)
        assert not wrong, "rank %d: these differ from gloo: %s" % (rank, wrong)


@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_every_collective_equals_gloo(size):
    _check_all_true(run_pooled(cases.collectives_vs_gloo, size, timeout=120))


@pytest.mark.slow
def test_every_collective_equals_gloo_on_4_ranks():
    _check_all_true(run_pooled(cases.collectives_vs_gloo, 4, timeout=180))


def test_subgroups_are_process_sets_among_their_members():
    out = run_pooled(cases.subgroups, 3, timeout=90)
    assert [o["parity"] for o in out] == [True] * 3
    assert out[0]["pair"] == out[1]["pair"] == (3.0, [0.0, 1.0])
    assert [o["dp"] for o in out] == [3.0] * 3 and [o["tp"] for o in out] == [0.0, 1.0, 2.0]  # mesh (3, 1)


@pytest.mark.slow
def test_a_2d_device_mesh_on_4_ranks():
    out = run_pooled(cases.subgroups, 4, timeout=120)
    assert [o["dp"] for o in out] == [2.0, 4.0, 2.0, 4.0]  # dp groups [0, 2] and [1, 3]
    assert [o["tp"] for o in out] == [1.0, 1.0, 5.0, 5.0]  # tp groups [0, 1] and [2, 3]


def test_divergent_ranks_get_an_error_naming_both_and_the_group_stays_usable():
    out = run_pooled(cases.mismatch_then_usable, 2, timeout=90)
    for rank, o in enumerate(out):
        assert o["raised"] is not None, "rank %d did not raise" % rank
        assert "rank 0" in o["raised"] and "rank 1" in o["raised"], o["raised"]
        assert o["after"] == [2.0, 2.0]


@pytest.mark.slow
def test_group_and_wait_timeouts_are_honoured():
    out = run_pooled(cases.timeouts, 2, timeout=90)
    assert out[0]["group"] == ("timeout", 2, True) and out[1]["group"][0] == "completed"
    assert out[0]["wait"] == "timeout" and out[1]["wait"] == "completed"
    assert [o["after"] for o in out] == [([2.0] * 3, [2.0] * 2)] * 2


def test_dead_peer_fails_the_survivors_pending_call():
    """spawn_ranks' timeout bounds the wait: a survivor that hung would fail the test there. The
    time it took is printed, not asserted."""
    results = spawn_ranks(cases.dead_peer, 3, args=(2,), timeout=90)
    for rank in (0, 1):
        message, seconds = results[rank].value
        print("rank %d raised after %.3f s" % (rank, seconds))
        assert message != "completed"
        assert "rank 2" in message, message


def test_the_core_writes_an_output_into_the_callers_buffer():
    for same, values, error, spaced, refused in run_pooled(cases.output_into_caller_buffer, 2, timeout=60):
        assert same and values == [0.0, 0.0, 1.0, 1.0]
        assert error is not None and "16 bytes" in error and "holds only 12" in error, error
        assert spaced == [5.0, -1.0, 5.0, -1.0, 6.0, -1.0, 6.0, -1.0]
        assert refused is not None and all(w in refused for w in ("'f64'", "float32", "float64")), refused


@pytest.mark.slow
def test_frozen_peer_fails_every_survivors_pending_call(tmp_path):
    """gloo reports no error within 60 s here; hvdlite within HVDLITE_LIVENESS_SECONDS (4 s). The
    time is printed, not asserted."""
    results = spawn_ranks(cases.frozen_peer, 3, args=(1, str(tmp_path)), timeout=120)
    for rank in (0, 2):
        message, seconds = results[rank].value
        print("rank %d raised after %.2f s: %s" % (rank, seconds, message))
        assert message != "completed" and "rank 1" in message, message


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_job_forms_through_torchs_store_without_launcher_variables():
    def env(rank):
        out = {name: None for name in job.names()}  # every variable that carries a job
        out["CASE_RANK"] = str(rank)
        return out

    out = run_ranks(cases.init_method_tcp, 2, args=(_free_port(),), env=env, timeout=90)
    assert out == [(0, 0, 3.0, 3.0), (1, 1, 3.0, 3.0)]


@pytest.mark.slow
def test_every_collective_equals_gloo_under_torchrun(tmp_path):
    """The same cases as a torchrun job: torch's own launcher, its agent store, its variables."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_backend_cases.py")
    cmd = [torchrun, "--nproc-per-node", "2", "--master-port", str(_free_port()), script, str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in [n for n in env if n.startswith(("HVDLITE_", "HOROVOD_"))]:
        del env[name]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = []
    for rank in range(2):
        with open(tmp_path / ("rank%d.json" % rank)) as f:
            results.append(json.load(f))
    _check_all_true(results)


def test_destroyed_subgroups_leave_no_process_set_and_the_world_can_start_again():
    """50 times a 2-rank subgroup (ranks 1, 2; rank 0 takes no part) is created, used and
    destroyed: its process set is removed among its members, so the core's table and the ids
    in use stay bounded (a removed id is reused)."""
    out = run_pooled(cases.group_lifetime, 3, args=(50,), timeout=120)
    for rank, o in enumerate(out):
        assert o["sums"] is True, rank
        assert o["peak"] <= 2, (rank, o["peak"])  # the global set and at most the one subgroup
        assert o["world"] == 3.0
        assert o["after_world"] == [0] and o["registry"] == [0], (rank, o)
        assert o["after_again"] == [0], (rank, o)
    assert out[1]["ids"] == out[2]["ids"] and len(out[1]["ids"]) == 1, out[1]["ids"]
    assert out[0]["fresh"] == out[2]["fresh"] == [0.0, 2.0]
    assert out[1]["kept"] == out[2]["kept"] == 2.0
    assert [o["again"] for o in out] == [(0, 3, 4.0), (1, 3, 4.0), (2, 3, 4.0)]
    for o in out[1:]:
        assert o["refused"].startswith("PreconditionError") and "destroyed" in o["refused"], o["refused"]
    split = "No device associated with the default pg, not safe to split any process groups"
    assert [o["split"] for o in out] == [split] * 3


def test_a_member_that_never_destroys_the_group_fails_the_others_naming_it():
    env = {"HVDLITE_STALL_CHECK_TIME_SECONDS": "0.5", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "1"}
    out = run_ranks(cases.member_never_destroys, 3, env=env, timeout=90)
    error = out[1][0]
    assert error is not None and error.startswith("HvdliteTimeoutError"), error
    assert "[1,2]" in error and "ranks 2 never submitted" in error, error
    assert out[0][0] is None and out[2][0] is None
    assert [o[1] for o in out] == [3.0, 3.0, 3.0]


def test_the_world_and_a_group_of_every_rank_run_calls_at_once():
    for a, b in run_pooled(cases.groups_on_one_set, 2, timeout=60):
        assert a == [2.0] * 3 and b == [4.0] * 3
