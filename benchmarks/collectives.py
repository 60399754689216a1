"""Size sweep of every collective: hvdlite against torch.distributed (gloo), mpi4py on Open MPI
and Horovod 0.28.1 (gloo), in one invocation, with nccl-tests' columns.

    python benchmarks/collectives.py                     # full sweep: 4 KiB..256 MiB, 2 and 4 ranks
    python benchmarks/collectives.py --quick             # smoke run: 3 sizes, 2 ranks, 5 repetitions
    python benchmarks/collectives.py --ops allreduce --ranks 2 --sizes 4K,1M,64M --peers mpi

For each rank count and library, one job runs every op and size (see _collectives_worker.py
for the per-size protocol). Writes OUT/collectives.md (the printed tables), OUT/collectives.json
(the rows) and OUT/collectives.png (busbw against size), OUT = --out-dir (benchmarks/results).
A peer that cannot run here (say Horovod did not build) is skipped with the reason printed.
Exit status: 0 when every job ran (even when #wrong is not 0: the table shows it), 1 otherwise.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report
from _cases import OPS
from _launch import HERE, LIBS, add_driver_args, available, host_line, run_job
from _machine import BUSY_LIMIT

WORKER = os.path.join(HERE, "_collectives_worker.py")
FULL = {
    "sizes": "4K,16K,64K,256K,1M,4M,16M,64M,256M",
    "ranks": "2,4",
    "reps": 20,
    "idle_wait": 20.0,
    "min_window": 0.5,
}
QUICK = {"sizes": "4K,64K,1M", "ranks": "2", "reps": 5, "idle_wait": 2.0, "min_window": 0.05}
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'4K' / '16M' / '1G' (binary units) or plain bytes -> bytes."""
    text = text.strip().upper().rstrip("IB")
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", help="comma-separated sizes, e.g. 4K,1M,256M (default %s)" % FULL["sizes"])
    p.add_argument("--ranks", help="comma-separated rank counts (default %s)" % FULL["ranks"])
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of %s" % ",".join(OPS))
    p.add_argument(
        "--reps",
        type=int,
        help="timed repetitions per size, at least (default %d; more when "
        "they take under %.1f s)" % (FULL["reps"], FULL["min_window"]),
    )
    p.add_argument("--peers", default="gloo,mpi,horovod", help="comma-separated peers, or 'none'")
    add_driver_args(
        p, quick="short smoke run: %s (else --idle-wait defaults to %.0f)" % (QUICK, FULL["idle_wait"])
    )
    p.add_argument("--job-timeout", type=float, default=3600.0, help="seconds one library's job may run")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    base = QUICK if args.quick else FULL
    args.sizes = [parse_size(s) for s in (args.sizes or base["sizes"]).split(",")]
    args.ranks = [int(n) for n in (args.ranks or base["ranks"]).split(",")]
    args.reps = args.reps or base["reps"]
    args.idle_wait = base["idle_wait"] if args.idle_wait is None else args.idle_wait
    args.ops = args.ops.split(",")
    args.peers = [] if args.peers == "none" else args.peers.split(",")
    for name in args.ops:
        if name not in OPS:
            p.error("unknown op %r (choose from %s)" % (name, ", ".join(OPS)))
    for name in args.peers:
        if name not in LIBS or name == "hvdlite":
            p.error("unknown peer %r (choose from gloo, mpi, horovod, or none)" % name)
    return args


def _notes(args, libs, versions, skipped):
    notes = [
        "# Collectives: hvdlite vs %s" % (", ".join(libs[1:]) or "(no peers)"),
        "",
        host_line(),
        "- libraries: " + "; ".join(versions.get(lib, lib) for lib in libs),
        "- float32; one compute thread per rank (OMP/MKL/OpenBLAS_NUM_THREADS=1, torch.set_num_threads(1)); "
        "allreduce and reducescatter sum; broadcast from rank 0; allreduce and broadcast in place",
        "- per size: correctness pass (#wrong: wrong elements, all ranks), warm-up, >= %d repetitions "
        "(more for short messages, to fill >= %.2f s) each after a barrier; time = max over ranks per "
        "repetition, median and min over repetitions; messages <= 1 MiB time 4-64 back-to-back calls "
        "per repetition" % (args.reps, QUICK["min_window"] if args.quick else FULL["min_window"]),
        "- bytes = per-rank buffer (allgather, reducescatter: the whole array); algbw = bytes / time, "
        "1 GB/s = 1e9 B/s; hvdlite/X = hvdlite busbw / X busbw (> 1: hvdlite faster)",
        "- others CPU: share of the machine (all cores) used by processes other than the ranks "
        "during the repetitions; '!' marks > %.0f%%: rerun on an idle machine" % (100 * BUSY_LIMIT),
    ]
    for lib, reason in skipped.items():
        notes.append("- **%s skipped**: %s" % (lib, reason))
    return notes


def run_all(args):
    """Runs every job; returns (rows, libs that ran, versions, skipped {lib: reason}, failed
    {"lib xN": reason})."""
    libs, skipped = available(["hvdlite"] + args.peers)
    failed, rows, versions = {}, [], {}
    worker_args = [
        "--ops",
        ",".join(args.ops),
        "--sizes",
        ",".join(map(str, args.sizes)),
        "--reps",
        str(args.reps),
        "--idle-wait",
        str(args.idle_wait),
        "--min-window",
        str(QUICK["min_window"] if args.quick else FULL["min_window"]),
    ]
    for n in args.ranks:
        for lib in libs:
            print("== %s, %d ranks" % (lib, n), flush=True)
            docs, error = run_job(lib, n, WORKER, worker_args, args.job_timeout)
            if docs:
                versions.setdefault(lib, docs[0].get("version", lib))
            rows.extend(_report.combine(lib, n, docs))
            if error:
                failed["%s x%d" % (lib, n)] = "job failed (%s); rows it did not finish are missing" % error
                print("%s on %d ranks failed: %s" % (lib, n, error), flush=True)
    return rows, libs, versions, skipped, failed


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rows, libs, versions, skipped, failed = run_all(args)
    notes = _notes(args, libs, versions, dict(skipped, **failed))
    text = _report.markdown(rows, libs, args.ranks, args.ops, notes)
    data = {"rows": rows, "versions": versions, "skipped": skipped, "failed": failed}
    plot = (
        None
        if args.no_plot or not rows
        else lambda path: _report.plot(rows, libs, args.ranks, args.ops, path)
    )
    _report.write_outputs(args.out_dir, "collectives", text, data, plot)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
