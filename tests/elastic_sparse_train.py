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
  ELASTIC_KILL_POINT  "backward": ELASTIC_KILL kills after the backward (the servers applied the
                      step's gradients and replicated them; the workers never commit it)
  ELASTIC_KILL_SERVED "worker_id:step[,worker_id:step]": that server SIGKILLs itself when it has
                      served so many steps, before the commit of the last (its rows were applied
                      and replicated)
  ELASTIC_SERVERS     how many of the last ranks serve (default 1)
  ELASTIC_REPLICATE   "1": the servers keep replicas (replicate=True, rejoin(state.step))
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
    served_kills = [p.rpartition(":") for p in os.environ.get("ELASTIC_KILL_SERVED", "").split(",") if p]
    served_step = next((int(n) for wid, _, n in served_kills if wid == me), None)
    kill_point = os.environ.get("ELASTIC_KILL_POINT", "lookup")
    replicate = os.environ.get("ELASTIC_REPLICATE") == "1"
    if after_wid == me:
        threading.Timer(after_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
    hvd.init()
    servers = list(range(hvd.size() - int(os.environ.get("ELASTIC_SERVERS", "1")), hvd.size()))
    emb = hvd.parallel.ShardedEmbeddingBag.from_dense(
        initial_table(), sharding="row", optimizer="adagrad", lr=LR, servers=servers, replicate=replicate
    )
    state = hvd.elastic.TorchState(step=0, d=torch.ones(DIM), log=[])
    served = [0]

    def on_step():
        served[0] += 1
        if served_step == served[0]:
            os.kill(os.getpid(), signal.SIGKILL)
        state.commit()

    @hvd.elastic.run
    def train(state):
        workers = emb.rejoin(state.step if replicate else None)  # first thing, every rank
        worker_set = hvd.add_process_set(workers)
        print("ROLE %s %d" % ("server" if emb.is_server else "worker", hvd.rank()), flush=True)
        if emb.is_server:
            emb.serve(on_step=on_step)  # the workers commit every step: so do the servers
            return
        mine = workers.index(hvd.rank())
        while state.step < steps:
            d = state.d.clone().requires_grad_()
            loss = loss_of(emb(*batch(state.step, mine)), d)
            if kill_wid == me and kill_step == state.step and kill_point == "lookup":
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            if kill_wid == me and kill_step == state.step and kill_point == "backward":
                os.kill(os.getpid(), signal.SIGKILL)
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
