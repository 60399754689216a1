"""One rank of collectives.py's size sweep for one library (started by _launch.py's launchers).

    python _collectives_worker.py --lib LIB --ops allreduce,... --sizes 4096,... --reps R
                                  --idle-wait S --min-window S --out DIR

Per op and size, every rank: a correctness pass on rank-dependent data (#wrong), buffers zeroed
(pages touched), a wait for an idle machine (rank 0 decides, see _machine.Gate), a warm-up, then
at least R repetitions (more when R would take less than --min-window seconds), each starting
after the library's barrier and timing K back-to-back calls (K > 1 only for messages <= 1 MiB).
Each rank writes DIR/rank<r>.json after every entry, so a job that dies still leaves what it
measured: {"lib", "version", "rank", "size", "entries": [{"op", "bytes", "count", "k", "reps",
"times" (seconds per call, one per repetition), "wrong", "error"}]};
rank 0's entries also carry "load" (LoadMeter.stop() over the repetitions) and "idle_wait_s".
"""

import os
import sys
import time

from _cases import OPS, Case, element_count
from _worker import finish, join, parse_args, rank_path, save_json

SMALL = 1 << 20  # messages up to this size are timed K calls at a time
WARMUP_REPS = 2  # untimed repetitions; they also estimate a repetition's length
MAX_REPS = 5000


def calls_per_rep(nbytes):
    """K: 1 above 1 MiB; otherwise 4 (1 MiB) up to 64 (<= 64 KiB)."""
    if nbytes > SMALL:
        return 1
    return max(4, min(64, 4 * (SMALL // max(nbytes, 1))))


def measure(comm, gate, op, nbytes, reps, idle_wait, min_window):
    """Runs one (op, size) entry on every rank; returns this rank's entry dict."""
    case = Case(comm, op, element_count(op, nbytes, comm.size))
    entry = {"op": op, "bytes": case.nbytes, "count": case.count, "k": calls_per_rep(nbytes)}
    entry["wrong"] = case.check()
    case.zero()
    idle = gate.wait_idle(idle_wait)
    k = entry["k"]
    warm = _repetitions(comm, case, k, WARMUP_REPS)
    entry["reps"] = reps = repetitions(comm.agree_max(sum(warm) * k / len(warm)), reps, min_window)
    meter = gate.meter() if comm.rank == 0 else None
    comm.barrier()
    if meter:
        meter.start()
    entry["times"] = _repetitions(comm, case, k, reps)
    if meter:
        entry["load"] = meter.stop()
        entry["idle_wait_s"] = idle[0]
    return entry


def _repetitions(comm, case, k, reps):
    """Times `reps` repetitions of k calls, each after a barrier; returns seconds per call."""
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            case.call()
        times.append((time.perf_counter() - t0) / k)
    return times


def repetitions(rep_s, min_reps, min_window):
    """Enough repetitions of rep_s seconds (the ranks' agreed estimate) to fill min_window
    seconds, at least min_reps, at most MAX_REPS: a window that short would hide the machine's
    load below /proc/stat's 10 ms resolution."""
    wanted = int(min_window / max(rep_s, 1e-7)) + 1
    return max(min_reps, min(MAX_REPS, wanted))


def _progress(lib, size, entry):
    if "times" in entry:
        t = sorted(entry["times"])[len(entry["times"]) // 2]
        what = "%.1f us, #wrong %d, others %.0f%%" % (t * 1e6, entry["wrong"], 100 * entry["load"]["others"])
    else:
        what = "error: %s" % entry["error"]
    print("  %s x%d %-13s %10d B  %s" % (lib, size, entry["op"], entry["bytes"], what), flush=True)


def _add_args(p):
    p.add_argument("--ops", required=True)
    p.add_argument("--sizes", required=True, help="bytes, comma-separated")
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--min-window", type=float, required=True)


def main():
    args = parse_args(_add_args)
    comm, gate = join(args)
    doc = {
        "lib": args.lib,
        "version": comm.version,
        "rank": comm.rank,
        "size": comm.size,
        "pid": os.getpid(),
        "entries": [],
    }
    for op in args.ops.split(","):
        assert op in OPS, op
        for nbytes in (int(s) for s in args.sizes.split(",")):
            try:
                entry = measure(comm, gate, op, nbytes, args.reps, args.idle_wait, args.min_window)
            except Exception as e:  # e.g. an op the library lacks: skip its other sizes
                entry = {
                    "op": op,
                    "bytes": nbytes,
                    "error": "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:200]),
                }
            doc["entries"].append(entry)
            save_json(rank_path(comm, args), doc)
            if comm.rank == 0:
                _progress(args.lib, comm.size, entry)
            if "error" in entry:
                break
    finish(comm, args)


if __name__ == "__main__":
    sys.exit(main())
