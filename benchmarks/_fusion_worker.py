"""One rank of fusion.py: ResNet-50's 161 gradients allreduced as a training step would.

    python _fusion_worker.py --lib LIB --reps R --idle-wait S --out DIR

A step submits every tensor asynchronously in reverse order (backward produces the last
layer's gradient first), then waits for all of them: comm.allreduce_async per tensor, then
comm.wait_all (for "mpi-blocking" each call is a blocking Allreduce; see _comms.py). Sum, in
place, float32. Per rank: a correctness step on rank-dependent data (#wrong), tensors zeroed,
WARMUP_STEPS untimed steps, a wait for an idle machine, then R steps each after a barrier
(_machine.timed_steps).
Writes DIR/rank<r>.json: {"lib", "version", "rank", "size", "entries": [{"op": "resnet50",
"bytes", "count", "k": 1, "reps", "times" (seconds per step), "wrong"}]}, rank 0's entry with
"load" as in _collectives_worker.py, so _report.combine reads both.
"""

import os
import sys

import numpy as np
from _machine import timed_steps
from _resnet50_shapes import SHAPES, TOTAL
from _worker import finish, join, parse_args

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
    times, load = timed_steps(comm, gate, lambda: step(comm, tensors), reps, idle_wait, warmup=WARMUP_STEPS)
    if load:
        entry["load"] = load
    entry["times"] = times
    return entry


def main():
    args = parse_args(lambda p: p.add_argument("--reps", type=int, required=True))
    comm, gate = join(args)
    entry = measure(comm, gate, args.reps, args.idle_wait)
    if comm.rank == 0:
        med = sorted(entry["times"])[len(entry["times"]) // 2]
        print(
            "  %s x%d resnet50: %.1f ms per step, #wrong %d, others %.0f%%"
            % (args.lib, comm.size, med * 1e3, entry["wrong"], 100 * entry["load"]["others"]),
            flush=True,
        )
    doc = {"lib": args.lib, "version": comm.version, "rank": comm.rank, "size": comm.size}
    finish(comm, args, dict(doc, pid=os.getpid(), entries=[entry]))


if __name__ == "__main__":
    sys.exit(main())
