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
