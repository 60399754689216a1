"""One rank of fusion.py: ResNet-50's 161 gradients allreduced as a training step would.

    python _fusion_worker.py --lib LIB --reps R --idle-wait S --out DIR

A step submits every tensor asynchronously in reverse order (backward produces the last
layer's gradient first), then waits for all of them: comm.allreduce_async per tensor, then
comm.wait_all (for "mpi-blocking" each call is a blocking Allreduce; see _comms.py). Sum, in
place, float32. Per rank: a correctness step on rank-dependent data (#wrong), tensors zeroed,
a wait for an idle machine, WARMUP_STEPS untimed steps, then R steps each after a barrier.
Writes DIR/rank<r>.json: {"lib", "version", "rank", "size", "entries": [{"op": "resnet50",
"bytes", "count", "k": 1, "reps", "times" (seconds per step), "wrong"}]}, rank 0's entry with
"load" as in _collectives_worker.py, so _report.combine reads both.
"""

import argparse
import os
import sys
import time

import numpy as np
from _collectives_worker import save_json
from _comms import make_comm
from _machine import Gate
from _resnet50_shapes import SHAPES, TOTAL

WARMUP_STEPS = 3


def step(comm, tensors):
    """One step: every tensor submitted, last first, then all awaited."""
    handles = [comm.allreduce_async(t, i) for i, t in reversed(list(enumerate(tensors)))]
    comm.wait_all([h for h in handles if h is not None])


def count_wrong(comm, tensors):
    """One step on rank-dependent data; returns the wrong elements on this rank."""
    n, r = comm.size, comm.rank
    for i, t in enumerate(tensors):
        t.fill(r + 1 + i % 5)
    step(comm, tensors)
    return sum(int(np.count_nonzero(t != n * (n + 1) / 2 + n * (i % 5))) for i, t in enumerate(tensors))


def measure(comm, gate, reps, idle_wait):
    tensors = [np.empty(shape, dtype=np.float32) for shape in SHAPES]
    entry = {"op": "resnet50", "bytes": TOTAL * 4, "count": TOTAL, "k": 1, "reps": reps}
    entry["wrong"] = count_wrong(comm, tensors)
    for t in tensors:
        t.fill(0)
    idle = gate.wait_idle(idle_wait)
    for _ in range(WARMUP_STEPS):
        step(comm, tensors)
    meter = gate.meter() if comm.rank == 0 else None
    comm.barrier()
    if meter:
        meter.start()
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        step(comm, tensors)
        times.append(time.perf_counter() - t0)
    if meter:
        entry["load"] = meter.stop()
        entry["idle_wait_s"] = idle[0]
    entry["times"] = times
    return entry


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--idle-wait", type=float, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    comm = make_comm(args.lib)
    gate = Gate(os.path.join(args.out, "gate"), comm.rank, comm.size)
    entry = measure(comm, gate, args.reps, args.idle_wait)
    doc = {
        "lib": args.lib,
        "version": comm.version,
        "rank": comm.rank,
        "size": comm.size,
        "pid": os.getpid(),
        "entries": [entry],
    }
    save_json(os.path.join(args.out, "rank%d.json" % comm.rank), doc)
    if comm.rank == 0:
        med = sorted(entry["times"])[len(entry["times"]) // 2]
        print(
            "  %s x%d resnet50: %.1f ms per step, #wrong %d, others %.0f%%"
            % (args.lib, comm.size, med * 1e3, entry["wrong"], 100 * entry["load"]["others"]),
            flush=True,
        )
    comm.barrier()
    comm.close()


if __name__ == "__main__":
    sys.exit(main())
