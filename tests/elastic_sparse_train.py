"""An elastic parameter-server job run by tests/test_sparse_elastic.py under `hvdliterun --min-np`.

The last rank serves one sharded table (row-wise Adagrad, so the servers' optimizer state
matters); the other ranks are workers, each on its own slice of the step's batch, with a dense
vector `d` averaged over the workers. Every committed step appends (step, number of workers) to
state.log, so the test can replay the committed steps in one process (`batch` and the constants
are shared with it) and compare the table and `d`.

Environment knobs:
  ELASTIC_STEPS       number of steps (default 12)
  ELASTIC_KILL        "worker_id:step": that worker SIGKILLs itself in that step, after its
                      lookup, before its backward (mid-step)
  ELASTIC_KILL_AFTER  "worker_id:seconds": that process SIGKILLs itself after so many seconds
                      (used on a server, which runs inside serve())
Output: "ROLE <server|worker> <rank>" per (re)entry, "STEP <step> <workers> <rank>" after each
commit on a worker, "DONE {log, d, table}" (JSON) at the end on rank 0.
"""

import json
import os
import signal
import threading
import time

import torch

ROWS, DIM, BAGS, BAG_LEN, LR = 40, 4, 4, 3, 0.05


def batch(step, worker):
    """(ids, offsets) of worker `worker`'s slice of step `step`'s batch (duplicates included)."""
    g = torch.Generator().manual_seed(1000 * step + worker)
    ids = torch.randint(0, ROWS, (BAGS * BAG_LEN,), generator=g)
    return ids, torch.arange(0, BAGS * BAG_LEN, BAG_LEN)


def loss_of(pooled, d):
    return (pooled @ d).pow(2).sum()


def initial_table():
    torch.manual_seed(0)
    return torch.nn.EmbeddingBag(ROWS, DIM, mode="sum")


def _plan(var):
    wid, _, value = os.environ.get(var, "").rpartition(":")
    return wid, float(value) if value else None


def main():
    import hvdlite.torch as hvd

    steps = int(os.environ.get("ELASTIC_STEPS", "12"))
    me = os.environ.get("HVDLITE_ELASTIC_WORKER_ID", "")
    kill_wid, kill_step = _plan("ELASTIC_KILL")
    after_wid, after_s = _plan("ELASTIC_KILL_AFTER")
    if after_wid == me:
        threading.Timer(after_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
    hvd.init()
    emb = hvd.parallel.ShardedEmbeddingBag.from_dense(
        initial_table(), sharding="row", optimizer="adagrad", lr=LR, servers=[hvd.size() - 1]
    )
    state = hvd.elastic.TorchState(step=0, d=torch.ones(DIM), log=[])

    @hvd.elastic.run
    def train(state):
        workers = emb.rejoin()  # first thing on every (re)entry, every rank
        worker_set = hvd.add_process_set(workers)
        print("ROLE %s %d" % ("server" if emb.is_server else "worker", hvd.rank()), flush=True)
        if emb.is_server:
            emb.serve(on_step=state.commit)  # the workers commit every step: so do the servers
            return
        mine = workers.index(hvd.rank())
        while state.step < steps:
            d = state.d.clone().requires_grad_()
            loss = loss_of(emb(*batch(state.step, mine)), d)
            if kill_wid == me and kill_step == state.step:
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            g = hvd.allreduce(d.grad, op=hvd.Average, name="dense", process_set=worker_set)
            emb.settle()  # this step's table gradients have left before the commit
            state.d = state.d - LR * g
            state.log.append((state.step, len(workers)))
            state.step += 1
            state.commit()
            print("STEP %d %d %d" % (state.step - 1, len(workers), hvd.rank()), flush=True)
            time.sleep(0.02)
        emb.stop_servers()

    train(state)
    table = emb.full_weight()
    if hvd.rank() == 0:
        done = {"log": state.log, "d": state.d.tolist(), "table": table.tolist()}
        print("DONE " + json.dumps(done), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
