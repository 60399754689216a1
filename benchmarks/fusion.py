"""ResNet-50's 161 gradients (25,557,032 float32, 97.5 MiB) allreduced like one training step:
hvdlite (fused by its runtime) against gloo async, Open MPI per tensor and async, and Horovod.

    python benchmarks/fusion.py                  # 2 and 4 ranks, 20 steps each
    python benchmarks/fusion.py --quick          # 2 ranks, 5 steps: a smoke run
    python benchmarks/fusion.py --ranks 2 --peers mpi

Each step submits every tensor asynchronously in reverse order, then waits for all (see
_fusion_worker.py). Libraries run with their default fusion settings. Writes OUT/fusion.md
and OUT/fusion.json, OUT = --out-dir (benchmarks/results). Exit status 1 when a job failed.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report
from _cases import BUS_FACTOR
from _launch import HERE, add_driver_args, available, host_line, run_job
from _machine import BUSY_LIMIT

WORKER = os.path.join(HERE, "_fusion_worker.py")
# Job name -> (library it needs, what the table calls it).
JOBS = {
    "hvdlite": ("hvdlite", "hvdlite (async, fused by the runtime)"),
    "gloo": ("gloo", "gloo (all_reduce async_op=True per tensor)"),
    "mpi-blocking": ("mpi", "Open MPI (blocking Allreduce per tensor)"),
    "mpi": ("mpi", "Open MPI (Iallreduce per tensor, Waitall)"),
    "horovod": ("horovod", "Horovod (allreduce_async_ per tensor, fused)"),
}
PEERS = {"gloo": ["gloo"], "mpi": ["mpi-blocking", "mpi"], "horovod": ["horovod"]}
FULL = {"ranks": "2,4", "reps": 20, "idle_wait": 20.0}
QUICK = {"ranks": "2", "reps": 5, "idle_wait": 2.0}
_SETTINGS = (
    "HVDLITE_FUSION_THRESHOLD",
    "HVDLITE_CYCLE_TIME",
    "HOROVOD_FUSION_THRESHOLD",
    "HOROVOD_CYCLE_TIME",
)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", help="comma-separated rank counts (default %s)" % FULL["ranks"])
    p.add_argument("--reps", type=int, help="timed steps (default %d)" % FULL["reps"])
    p.add_argument("--peers", default="gloo,mpi,horovod", help="comma-separated peers, or 'none'")
    add_driver_args(
        p, quick="short smoke run: %s (else --idle-wait defaults to %.0f)" % (QUICK, FULL["idle_wait"])
    )
    p.add_argument("--job-timeout", type=float, default=1800.0, help="seconds one library's job may run")
    args = p.parse_args(argv)
    base = QUICK if args.quick else FULL
    args.ranks = [int(n) for n in (args.ranks or base["ranks"]).split(",")]
    args.reps = args.reps or base["reps"]
    args.idle_wait = base["idle_wait"] if args.idle_wait is None else args.idle_wait
    args.peers = [] if args.peers == "none" else args.peers.split(",")
    for name in args.peers:
        if name not in PEERS:
            p.error("unknown peer %r (choose from %s, or none)" % (name, ", ".join(PEERS)))
    return args


def run_all(args):
    """Runs every job; returns (rows, job names that ran, versions, skipped, failed)."""
    names = ["hvdlite"] + [job for peer in args.peers for job in PEERS[peer]]
    ran, skipped = available(names, lambda name: JOBS[name][0])
    failed, rows, versions = {}, [], {}
    worker_args = ["--reps", str(args.reps), "--idle-wait", str(args.idle_wait)]
    for n in args.ranks:
        for name in ran:
            print("== %s, %d ranks" % (name, n), flush=True)
            docs, error = run_job(name, n, WORKER, worker_args, args.job_timeout)
            if docs:
                versions.setdefault(JOBS[name][0], docs[0].get("version"))
            rows.extend(_report.combine(name, n, docs, BUS_FACTOR["allreduce"]))
            if error:
                failed["%s x%d" % (name, n)] = "job failed (%s)" % error
    return rows, ran, versions, skipped, failed


def table(rows, ranks):
    """Markdown lines: a row per (ranks, job); peers' rows carry peer time / hvdlite time."""
    head = [
        "ranks",
        "library",
        "step median",
        "step min",
        "busbw GB/s",
        "#wrong",
        "others CPU",
        "peer time / hvdlite time",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in ranks:
        mine = next((r for r in rows if r["ranks"] == n and r["lib"] == "hvdlite" and not r["error"]), None)
        for r in (r for r in rows if r["ranks"] == n):
            label = JOBS[r["lib"]][1]
            if r["error"]:
                lines.append("| %d | %s | error: %s |  |  |  |  |  |" % (n, label, r["error"]))
                continue
            ratio = "%.2f×" % (r["median"] / mine["median"]) if mine and r["lib"] != "hvdlite" else ""
            lines.append(
                "| %d | %s | %s | %s | %.3f | %d | %s | %s |"
                % (
                    n,
                    label,
                    _report.fmt_time(r["median"]),
                    _report.fmt_time(r["min"]),
                    r["busbw"],
                    r["wrong"],
                    _report.fmt_others(r["others"]),
                    ratio,
                )
            )
    return lines


def notes(args, versions, skipped):
    settings = ", ".join("%s=%s" % (k, os.environ[k]) for k in _SETTINGS if k in os.environ) or "none set"
    out = [
        "# ResNet-50 gradient set: 161 tensors, 25,557,032 float32 (97.5 MiB), one step",
        "",
        host_line(),
        "- libraries: " + "; ".join(v for v in versions.values() if v),
        "- a step submits every tensor asynchronously in reverse order, then waits for all; Sum, in place; "
        "one compute thread per rank; fusion settings: library defaults (%s)" % settings,
        "- correctness step on rank-dependent data (#wrong), 3 warm-up steps, %d timed steps each after "
        "a barrier; time = max over ranks per step, median and min over steps; busbw = 97.5 MiB / time "
        "× 2(n−1)/n" % args.reps,
        "- others CPU: share of the machine used by other processes during the timed steps; "
        "'!' marks > %.0f%%: rerun on an idle machine" % (100 * BUSY_LIMIT),
    ]
    out += ["- **%s skipped**: %s" % (k, v) for k, v in skipped.items()]
    return out + [""]


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rows, _ran, versions, skipped, failed = run_all(args)
    text = "\n".join(notes(args, versions, dict(skipped, **failed)) + table(rows, args.ranks))
    data = {"rows": rows, "versions": versions, "skipped": skipped, "failed": failed}
    _report.write_outputs(args.out_dir, "fusion", text, data)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
