"""hvdlite's CPU data paths under mpirun, side by side: the native ring
(HVDLITE_CPU_OPERATIONS=ring), the mpi backend (=mpi) and the default (=auto: the
per-collective choice in csrc/backend/registry.cc, made from this script's numbers). A helper (make bench skips it), run by hand
when a data path changes, and a module with measure() for other scripts:

    python benchmarks/_mpi_path.py [--np 2] [--sizes 4096,1048576,...] [--reps 20]

measure(np, path, ...) runs collectives.py's worker (_collectives_worker.py: a correctness pass
with rank-dependent data first (#wrong), warm-up, repetitions each after a barrier, the max
over ranks per repetition, median and min over repetitions; messages <= 1 MiB time K calls per
repetition) as hvdlite ranks started by mpirun (_launch.run_job with the mpi launcher, unbound
as `hvdliterun --mpi` runs them) with HVDLITE_CPU_OPERATIONS=path, one compute thread per rank,
and returns _report.combine's rows (one per collective and size: "median", "min", "busbw",
"wrong", "others" (the share of the machine other processes used meanwhile: re-run when it is
above ~10%), "error") with "path" added. Nothing here asserts a time.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report
from _cases import OPS
from _launch import HERE, run_job

WORKER = os.path.join(HERE, "_collectives_worker.py")
DEFAULT_SIZES = (4096, 65536, 1 << 20, 16 << 20, 64 << 20)
MIN_WINDOW_S = 0.2  # at least this long per (op, size): shorter hides the load (see _collectives_worker)
_UNBOUND = {"OMPI_MCA_hwloc_base_binding_policy": "none"}  # hvdliterun --mpi's --bind-to none


def measure(np_ranks, path, ops=OPS, sizes=DEFAULT_SIZES, reps=20, timeout=600, idle_wait=2.0):
    """Rows of every (op, size) with HVDLITE_CPU_OPERATIONS=path; raises RuntimeError when the
    job fails."""
    args = ["--ops", ",".join(ops), "--sizes", ",".join(str(s) for s in sizes), "--reps", str(reps)]
    args += ["--idle-wait", str(idle_wait), "--min-window", str(MIN_WINDOW_S)]
    env = dict(_UNBOUND, HVDLITE_CPU_OPERATIONS=path)
    docs, error = run_job("hvdlite", np_ranks, WORKER, args, timeout, env=env, launcher="mpi")
    if error:
        raise RuntimeError("the %s job under mpirun failed: %s" % (path, error))
    return [dict(row, path=path) for row in _report.combine(path, np_ranks, docs)]


def _report_table(by_path):
    """Prints a line per (op, size): each path's median time and busbw, ring/mpi and #wrong."""
    paths = list(by_path)
    print(
        "%-14s %-8s" % ("op", "size")
        + "".join("%14s" % p for p in paths)
        + "".join("%12s" % (p + " busbw") for p in paths)
        + "%10s %6s" % ("ring/mpi", "#wrong")
    )
    index = {(r["op"], r["bytes"], p): r for p in paths for r in by_path[p]}
    for op, nbytes in dict.fromkeys((r["op"], r["bytes"]) for p in paths for r in by_path[p]):
        line = "%-14s %-8s" % (op, _report.fmt_size(nbytes))
        rows = [index.get((op, nbytes, p), {"path": p, "error": "not measured"}) for p in paths]
        if any(r["error"] for r in rows):
            print(
                line + "  error: " + "; ".join("%s: %s" % (r["path"], r["error"]) for r in rows if r["error"])
            )
            continue
        line += "".join("%14s" % _report.fmt_time(r["median"]) for r in rows)
        line += "".join("%7.2f GB/s" % r["busbw"] for r in rows)
        ring, mpi = rows[paths.index("ring")], rows[paths.index("mpi")]
        print(line + "%9.2fx %6d" % (ring["median"] / mpi["median"], sum(r["wrong"] for r in rows)))
    print(
        "others' CPU during the runs (max): "
        + ", ".join("%s %.0f%%" % (p, 100 * max(r.get("others", 0.0) for r in by_path[p])) for p in paths)
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--idle-wait", type=float, default=2.0, help="max seconds to wait for an idle machine")
    p.add_argument(
        "--paths",
        default="ring,mpi,auto",
        help="HVDLITE_CPU_OPERATIONS values to compare (ring and mpi are required)",
    )
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    by_path = {
        path: measure(args.np, path, args.ops.split(","), sizes, args.reps, idle_wait=args.idle_wait)
        for path in args.paths.split(",")
    }
    print(
        "hvdlite CPU data paths under mpirun -n %d (one compute thread per rank), float32, median of >= %d"
        % (args.np, args.reps)
    )
    _report_table(by_path)


if __name__ == "__main__":
    main()
