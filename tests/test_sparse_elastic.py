"""Elastic training of the parameter-server mode (hvdlite/torch/parallel/sparse/elastic.py), with
real processes killed: tests/elastic_sparse_train.py under `hvdliterun --min-np` over localhost
"hosts" (as tests/test_elastic.py runs its NumPy loop).

A worker that dies: the survivors and the server re-form, the server keeps its shard and its
Adagrad state, and the finished table and dense vector equal one process replaying the committed
steps (each with the number of workers it ran with); a process the driver starts in the dead
worker's place with the server's rank becomes a worker (slow). A server that dies: every
survivor raises an error naming it, and the job ends (no hang; slow)."""

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from elastic_sparse_train import LR, ROWS, batch, initial_table, loss_of
from test_elastic import REPO, hvdliterun, worker_lines

pytestmark = pytest.mark.elastic
SCRIPT = str(REPO / "tests" / "elastic_sparse_train.py")
HOSTS3 = "localhost:1,127.0.0.1:1,127.0.0.2:1"


def replay(log):
    """The table and `d` of one process running the committed steps on the whole batch: the
    gradients averaged over that step's workers, row-wise Adagrad on the table, SGD on d."""
    w = initial_table().weight.detach().clone()
    sum_sq, d = torch.zeros(ROWS), torch.ones(w.shape[1])
    for step, workers in log:
        gw, gd = torch.zeros_like(w), torch.zeros_like(d)
        for i in range(workers):
            wt, dt = w.clone().requires_grad_(), d.clone().requires_grad_()
            ids, offsets = batch(step, i)
            loss_of(F.embedding_bag(ids, wt, offsets, mode="sum"), dt).backward()
            gw += wt.grad / workers
            gd += dt.grad / workers
        sum_sq += gw.pow(2).mean(dim=1)  # untouched rows: zero gradient, no change
        w -= LR * gw / (sum_sq.sqrt() + 1e-10).unsqueeze(1)
        d -= LR * gd
    return w, d


def done_of(res):
    for lines in worker_lines(res.stdout).values():
        for line in lines:
            if line.startswith("DONE "):
                done = json.loads(line[5:])
                return [tuple(x) for x in done["log"]], torch.tensor(done["d"]), torch.tensor(done["table"])
    raise AssertionError("no DONE line:\n" + res.stdout[-3000:] + res.stderr[-3000:])


def _train_through_a_dead_worker(hosts, *args):
    """Runs the script on 3 ranks of `hosts` with worker 127.0.0.1[0] SIGKILLed mid-step 4 of 10;
    checks the committed steps against the replay. Returns (log, stdout lines per worker)."""
    env = {"ELASTIC_STEPS": "10", "ELASTIC_KILL": "127.0.0.1[0]:4"}
    res = hvdliterun("-np", 3, "--min-np", 2, *args, "-H", hosts, sys.executable, SCRIPT, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    log, d, table = done_of(res)
    assert [s for s, _ in log] == list(range(10)), log
    w_ref, d_ref = replay(log)
    torch.testing.assert_close(table, w_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d, d_ref, rtol=1e-5, atol=1e-6)
    out = worker_lines(res.stdout)
    return log, {wid: [line for line in lines if line.startswith("ROLE")] for wid, lines in out.items()}


@pytest.mark.slow  # (default suite's 5-minute budget: CI runs it)
def test_a_dead_worker_loses_no_server_state_and_training_goes_on():
    log, roles = _train_through_a_dead_worker(HOSTS3)
    assert [w for _, w in log] == [2] * 4 + [1] * 6, log  # the step the worker died in is redone
    # the server was never restarted: one process, serving in both worlds (rank 2, then rank 1)
    assert roles["127.0.0.2[0]"] == ["ROLE server 2", "ROLE server 1"], roles
    assert sorted(roles) == ["127.0.0.1[0]", "127.0.0.2[0]", "localhost[0]"]


@pytest.mark.slow
def test_a_worker_started_into_a_later_world_with_a_servers_rank_becomes_a_worker():
    # the driver replaces the dead worker on a spare host; the new process gets rank 2, which its
    # script names the server (servers=[size - 1]): rejoin() makes it a worker holding nothing
    log, roles = _train_through_a_dead_worker(HOSTS3 + ",127.0.0.3:1", "--max-np", 3)
    assert [w for _, w in log] == [2] * 10, log
    assert roles["127.0.0.2[0]"] == ["ROLE server 2", "ROLE server 1"], roles
    assert roles["127.0.0.3[0]"] == ["ROLE worker 2"], roles


@pytest.mark.slow
def test_a_dead_server_is_an_error_naming_it():
    env = {"ELASTIC_STEPS": "100000", "ELASTIC_KILL_AFTER": "127.0.0.2[0]:3"}
    res = hvdliterun("-np", 3, "--min-np", 2, "-H", HOSTS3, sys.executable, SCRIPT, env=env)
    assert res.returncode != 0
    assert "server rank(s) [2] of the last world died with its shards and optimizer state" in res.stderr, (
        res.stderr[-4000:]
    )


HOSTS4 = HOSTS3 + ",127.0.0.3:1"


def _replicated(env, steps=10):
    """Runs the script on 4 ranks of 4 "hosts": workers 0 and 1, servers 2 and 3 holding the
    table by rows, with replicas (replicate=True). Returns (log, d, table, stderr)."""
    env = dict(env, ELASTIC_STEPS=str(steps), ELASTIC_SERVERS="2", ELASTIC_REPLICATE="1")
    res = hvdliterun("-np", 4, "--min-np", 2, "-H", HOSTS4, sys.executable, SCRIPT, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    return (*done_of(res), res)


@pytest.mark.slow
def test_a_dead_server_is_replaced_from_its_buddy_and_the_result_is_unchanged():
    # server 127.0.0.3[0] (rank 3, rows 20..39) dies after it applied and replicated step 5,
    # before that step's commit: its buddy (rank 2) takes its rows, from then on one server
    # holds the whole table, and the run equals one with no failure, to fp32 rounding: the
    # same committed steps, each with both workers, every step's update applied once
    log, d, table, res = _replicated({"ELASTIC_KILL_SERVED": "127.0.0.3[0]:5"})
    assert log == [(s, 2) for s in range(10)], log
    w_ref, d_ref = replay(log)
    torch.testing.assert_close(table, w_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d, d_ref, rtol=1e-5, atol=1e-6)
    roles = worker_lines(res.stdout)  # the buddy, never restarted, serves in both worlds
    assert [x for x in roles["127.0.0.2[0]"] if x.startswith("ROLE")] == ["ROLE server 2", "ROLE server 2"]
    assert "127.0.0.3[0] was killed by signal 9" in res.stdout + res.stderr


@pytest.mark.slow
def test_replicated_servers_roll_back_a_step_the_workers_never_committed():
    # a worker dies after its backward: both servers applied (and replicated) that step, the
    # survivor redoes it from the last commit alone; the servers roll it back first, so the
    # table equals the replay in which that step ran once, with one worker
    env = {"ELASTIC_KILL": "127.0.0.1[0]:4", "ELASTIC_KILL_POINT": "backward"}
    log, d, table, _ = _replicated(env)
    assert log == [(s, 2) for s in range(4)] + [(s, 1) for s in range(4, 10)], log
    w_ref, d_ref = replay(log)
    torch.testing.assert_close(table, w_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d, d_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_server_and_its_buddy_lost_together_is_an_error_naming_both():
    env = {
        "ELASTIC_STEPS": "100000",
        "ELASTIC_SERVERS": "2",
        "ELASTIC_REPLICATE": "1",
        "ELASTIC_KILL_SERVED": "127.0.0.2[0]:3,127.0.0.3[0]:3",  # both servers, one step
    }
    res = hvdliterun("-np", 4, "--min-np", 2, "-H", HOSTS4, sys.executable, SCRIPT, env=env)
    assert res.returncode != 0
    assert (
        "server rank 2 and its buddy, rank 3" in res.stderr
        or "server rank 3 and its buddy, rank 2" in res.stderr
    ), res.stderr[-4000:]
    assert "died together" in res.stderr and "load_sparse_checkpoint" in res.stderr
