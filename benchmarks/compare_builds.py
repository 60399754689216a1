"""Two hvdlite source trees side by side in one run, with the peers: the before/after table.

    python benchmarks/compare_builds.py --before /work/before                # ~4 minutes on 2 cores
    python benchmarks/compare_builds.py --before /work/before --quick        # ~3 minutes
    python benchmarks/compare_builds.py --before A --after B --only latency fusion

Each tree must be built in place (hvdlite/_core*.so present); --after defaults to the tree this
script is in. Every job runs this script's benchmark workers (the same measuring code for both
trees) with PYTHONPATH set to the tree, so hvdliterun and the ranks import that tree's hvdlite.
The jobs are interleaved: each round runs every measure once per tree, the trees' order
alternating from round to round (before-after, after-before, ...), then the peer, so the
machine's load drifts over both trees alike. A job's value is the median over its repetitions
(per repetition the slowest rank counts); the table shows the median over rounds.

Measures, 2 ranks (--only picks groups):
  latency  4 KiB allreduce time and 1 MiB allreduce busbw, through hvdlite's shared memory
           (and, by default, 64 MiB busbw) and over TCP (HVDLITE_SHM_DISABLE=1); peer: mpi4py on
           Open MPI, over shared memory, and over TCP (OMPI_MCA_btl=self,tcp) for the TCP rows
  fusion   ResNet-50's 161 gradients as one step (fusion.py); peer: Open MPI's blocking
           Allreduce per tensor
  torch    the 25M-parameter MLP's step ÷ the no-communication step (e2e_torch.py's nocomm row,
           run once per round); peer: DDP over gloo, the same ratio
  tf       the same ratio in TensorFlow (e2e_tf.py); no peer
Writes OUT/compare_builds.md (measure | before | after | peer | after/peer | goal, the goals
being issue 15's) and OUT/compare_builds.json (every job's value in every round); OUT =
--out-dir (benchmarks/results). Exit status 1 when a job failed (its cells stay empty).
Nothing is asserted about speed.
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report
import e2e_tf
import e2e_torch
from _launch import HERE, ROOT, add_driver_args, host_line, run_job, unavailable
from _machine import BUSY_LIMIT

RANKS = 2
GROUPS = ("latency", "fusion", "torch", "tf")
# Per mode: rounds of the collective groups and of the (slow to start) end-to-end groups, and
# what each job measures.
MODES = {
    "default": {
        "rounds": 5,
        "e2e_rounds": 3,
        "sizes": (4096, 1 << 20, 64 << 20),
        "reps": 10,
        "min_window": 0.3,
        "fusion_reps": 8,
        "steps": 20,
        "idle_wait": 1.0,
        "budget_s": 570.0,
    },
    "quick": {
        "rounds": 2,
        "e2e_rounds": 1,
        "sizes": (4096, 1 << 20),
        "reps": 5,
        "min_window": 0.1,
        "fusion_reps": 4,
        "steps": 3,
        "idle_wait": 0.5,
        "budget_s": 180.0,
    },
}
TCP = {"HVDLITE_SHM_DISABLE": "1"}
MPI_TCP = {"OMPI_MCA_btl": "self,tcp"}  # Open MPI without its shared-memory transport
TCP_MAX_BYTES = 1 << 20


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the hvdlite tree to compare against, built in place")
    p.add_argument("--after", default=ROOT, help="the new tree, built in place (default: %(default)s)")
    p.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS), help="a subset of the measures")
    p.add_argument("--rounds", type=int, help="rounds of latency and fusion (default 5; --quick 2)")
    p.add_argument("--e2e-rounds", type=int, help="rounds of torch and tf (default 3; --quick 1)")
    p.add_argument(
        "--budget-s",
        type=float,
        help="after two rounds, start no round that would end past this (default 570; --quick 180)",
    )
    add_driver_args(p, quick="~3 minutes: fewer rounds, sizes, repetitions and steps")
    args = p.parse_args(argv)
    mode = dict(MODES["quick" if args.quick else "default"])
    for key in ("rounds", "e2e_rounds", "idle_wait", "budget_s"):
        if getattr(args, key) is not None:
            mode[key] = getattr(args, key)
    args.mode = mode
    args.trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    for name, tree in args.trees.items():
        if not glob.glob(os.path.join(tree, "hvdlite", "_core*.so")):
            p.error(
                "--%s %s: no hvdlite/_core*.so (build it in place: setup.py build_ext --inplace)"
                % (name, tree)
            )
    return args


def describe_tree(tree):
    """'<short commit> <subject>' of a git tree (plus ' (uncommitted changes)'), or the path."""
    try:
        head = subprocess.run(
            ["git", "-C", tree, "log", "-1", "--format=%h %s"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return tree
    head = head if len(head) <= 72 else head[:71] + "…"
    return "%s: %s%s" % (tree, head or "?", " (uncommitted changes)" if dirty else "")


# -- jobs: one launch each, returning {field: value} --------------------------------------------


def _sizes(variant, m):
    """The allreduce sizes of a latency variant: over TCP only up to TCP_MAX_BYTES (Open MPI's
    TCP transport takes seconds for 64 MiB, and no goal is set there)."""
    return [s for s in m["sizes"] if variant == "shm" or s <= TCP_MAX_BYTES]


def _collectives(variant):
    def job(lib, env, m, idle_wait):
        args = [
            "--ops",
            "allreduce",
            "--sizes",
            ",".join(map(str, _sizes(variant, m))),
            "--reps",
            str(m["reps"]),
        ]
        args += ["--idle-wait", str(idle_wait), "--min-window", str(m["min_window"])]
        docs, error = run_job(lib, RANKS, os.path.join(HERE, "_collectives_worker.py"), args, 600, env=env)
        values = {}
        for row in _report.combine(lib, RANKS, docs):
            if not row["error"]:
                values["time.%d" % row["bytes"]] = row["median"]
                values["busbw.%d" % row["bytes"]] = row["busbw"]
                values["others"] = max(values.get("others", 0.0), row["others"])
        return values, error

    return job


def _fusion(lib, env, m, idle_wait):
    args = ["--reps", str(m["fusion_reps"]), "--idle-wait", str(idle_wait)]
    docs, error = run_job(lib, RANKS, os.path.join(HERE, "_fusion_worker.py"), args, 600, env=env)
    rows = [r for r in _report.combine(lib, RANKS, docs, lambda n: 1.0) if not r["error"]]
    return ({"step": rows[0]["median"], "others": rows[0]["others"]} if rows else {}), error


def _e2e(framework, row):
    module = e2e_torch if framework == "torch" else e2e_tf

    def job(_lib, env, m, idle_wait):
        r = e2e_torch.run_row(row, "mlp", m["steps"], idle_wait, module.ROWS, module.WORKER, env)
        if "median_s" not in r:
            return {}, r.get("error") or r.get("skipped")
        return {"step": r["median_s"], "others": r["others"]}, None

    return job


def round_jobs(args, index):
    """[(group, variant, who, lib, env, job)] of round `index`: per group, every variant once per
    tree (the trees' order alternates with the round; an end-to-end group's no-communication
    floor runs between them, next to both), then the peer."""
    trees = ["before", "after"] if index % 2 == 0 else ["after", "before"]
    tree_env = {who: {"PYTHONPATH": args.trees[who]} for who in args.trees}
    m, out = args.mode, []

    def add(group, variant, runs, peers, floor=None):
        for i, who in enumerate(trees):
            out.append((group, variant, who, runs[0], dict(tree_env[who], **runs[1]), runs[2]))
            if floor and i == 0:
                out.append((group, variant, "nocomm", "hvdlite", tree_env["after"], floor))
        for who, lib, env, job in peers:
            out.append((group, variant, who, lib, dict(tree_env["after"], **env), job))

    if "latency" in args.only and index < m["rounds"]:
        for variant, env, peer_env in (("shm", {}, {}), ("tcp", TCP, MPI_TCP)):
            job = _collectives(variant)
            add("latency", variant, ("hvdlite", env, job), [("peer", "mpi", peer_env, job)])
    if "fusion" in args.only and index < m["rounds"]:
        add("fusion", "resnet50", ("hvdlite", {}, _fusion), [("peer", "mpi-blocking", {}, _fusion)])
    for group in ("torch", "tf"):
        if group in args.only and index < m["e2e_rounds"]:
            peers = [("peer", "gloo", {}, _e2e(group, "ddp"))] if group == "torch" else []
            add(group, "mlp", ("hvdlite", {}, _e2e(group, "hvdlite")), peers, floor=_e2e(group, "nocomm"))
    return out


def run_rounds(args, budget_s):
    """Runs the rounds; returns (results [{group, variant, who, round, values, error, seconds}],
    the peers skipped {lib: reason}, rounds run). After the first two rounds, a round whose jobs
    (timed by their last run) would end past `budget_s` is not started."""
    results, skipped, last = [], {}, {}
    for lib in ("mpi", "gloo"):
        reason = unavailable(lib)
        if reason:
            skipped[lib] = reason
            print("skipping the %s peer: %s" % (lib, reason), flush=True)
    m, t0, index = args.mode, time.monotonic(), 0
    for index in range(max(m["rounds"], m["e2e_rounds"])):
        jobs = [j for j in round_jobs(args, index) if j[3].split("-")[0] not in skipped]
        expected = sum(last.get(j[:3], 0.0) for j in jobs)
        if index >= 2 and time.monotonic() - t0 + expected > budget_s:
            print("stopping after %d rounds: the next would end past %.0f s" % (index, budget_s), flush=True)
            return results, skipped, index
        for group, variant, who, lib, env, job in jobs:
            start = time.monotonic()
            values, error = job(lib, env, m, m["idle_wait"])
            last[(group, variant, who)] = seconds = time.monotonic() - start
            results.append(
                {
                    "group": group,
                    "variant": variant,
                    "who": who,
                    "round": index,
                    "values": values,
                    "error": error,
                    "seconds": seconds,
                }
            )
            shown = ", ".join("%s %.4g" % kv for kv in sorted(values.items()))
            print(
                "round %d: %s %s %s (%.0f s): %s" % (index + 1, group, variant, who, seconds, error or shown),
                flush=True,
            )
    return results, skipped, max(m["rounds"], m["e2e_rounds"])


# -- the table ---------------------------------------------------------------------------------


def _per_round(results, group, variant, who, field):
    return {
        r["round"]: r["values"][field]
        for r in results
        if (r["group"], r["variant"], r["who"]) == (group, variant, who) and field in r["values"]
    }


def value(results, measure, who):
    """Median over rounds of `who`'s value of `measure` (a step ÷ that round's nocomm step for
    the end-to-end groups); None when no round has it."""
    group, variant, field = measure["key"]
    mine = _per_round(results, group, variant, who, field)
    if measure.get("over_nocomm"):
        floor = _per_round(results, group, variant, "nocomm", field)
        mine = {i: v / floor[i] for i, v in mine.items() if floor.get(i)}
    return statistics.median(mine.values()) if mine else None


def ratio(results, measure):
    """Median over rounds of that round's after ÷ peer: the two ran minutes apart at most, so
    when the machine changes speed between rounds (this VM does), each ratio still compares
    like with like, as the end-to-end rows' per-round floors do. None without a common round."""
    group, variant, field = measure["key"]
    after = _per_round(results, group, variant, "after", field)
    peer = _per_round(results, group, variant, "peer", field)
    both = [after[i] / peer[i] for i in after if peer.get(i)]
    return statistics.median(both) if both else None


def measures(args):
    """The table's rows, in order: label, key (group, variant, field), how a value is shown, the
    peer's name, and the goal (`after` or `after/peer` compared with a bound; None: information)."""
    out = []
    for variant, medium, peer in (("shm", "shared memory", "Open MPI"), ("tcp", "TCP", "Open MPI (TCP)")):
        goals = {
            4096: ("after/peer", "<=", 2.0),
            1 << 20: ("after/peer", ">=", 1.2),
            64 << 20: ("after/peer", ">=", 4.0),
        }
        for size in _sizes(variant, args.mode):
            what = (
                ("time", "%s allreduce latency" % _report.fmt_size(size))
                if size <= 4096
                else (
                    "busbw",
                    "%s allreduce busbw" % _report.fmt_size(size),
                )
            )
            out.append(
                {
                    "label": "%s (%s)" % (what[1], medium),
                    "key": ("latency", variant, "%s.%d" % (what[0], size)),
                    "fmt": _report.fmt_time if what[0] == "time" else "{:.2f} GB/s".format,
                    "peer": peer,
                    "goal": goals[size] if variant == "shm" else None,
                }
            )
    out.append(
        {
            "label": "ResNet-50's 161 gradients, one async step",
            "key": ("fusion", "resnet50", "step"),
            "fmt": _report.fmt_time,
            "peer": "Open MPI per tensor",
            "goal": ("after/peer", "<=", 0.6),
        }
    )
    for group, label, peer, bound in (
        ("torch", "torch 25M MLP step ÷ no-communication step", "DDP", 1.08),
        ("tf", "TensorFlow 25M MLP step ÷ no-communication step", None, 1.15),
    ):
        out.append(
            {
                "label": label,
                "key": (group, "mlp", "step"),
                "fmt": "{:.2f}×".format,
                "peer": peer,
                "goal": ("after", "<=", bound),
                "over_nocomm": True,
            }
        )
    return [m for m in out if m["key"][0] in args.only]


def _goal_cell(goal, after, after_over_peer):
    if goal is None:
        return "(information)"
    what, op, bound = goal
    text = "%s %s %g×" % (what, "≤" if op == "<=" else "≥", bound)
    x = after if what == "after" else after_over_peer
    if x is None:
        return text
    met = x <= bound if op == "<=" else x >= bound
    return text + (": met" if met else ": missed")


def table(results, args):
    """Markdown lines: measure | before | after | peer | after/peer | goal."""
    lines = ["| measure | before | after | peer | after/peer | goal |", "|---|---|---|---|---|---|"]
    for m in measures(args):
        before, after, peer = (value(results, m, who) for who in ("before", "after", "peer"))
        shown = [m["fmt"](v) if v is not None else "" for v in (before, after, peer)]
        if m["peer"] and shown[2]:
            shown[2] = "%s %s" % (m["peer"], shown[2])
        over = ratio(results, m) if m["peer"] else None
        lines.append(
            "| %s | %s | %s | %s | %s | %s |"
            % (m["label"], *shown, "%.2f×" % over if over else "", _goal_cell(m["goal"], after, over))
        )
    return lines


def notes(args, results, skipped, rounds_run, wall_s, load):
    others = [r["values"]["others"] for r in results if "others" in r["values"]]
    m = args.mode
    out = [
        "# hvdlite before/after, side by side (%s mode)" % ("quick" if args.quick else "default"),
        "",
        host_line(),
        "- before: %s" % describe_tree(args.trees["before"]),
        "- after: %s" % describe_tree(args.trees["after"]),
        "- %d ranks, one compute thread each; %d rounds of latency/fusion, %d of torch/tf (%s); the "
        "trees alternate within each round, then the peer; a value is the median over rounds of each "
        "job's median (slowest rank per repetition)"
        % (
            RANKS,
            min(rounds_run, m["rounds"]),
            min(rounds_run, m["e2e_rounds"]),
            "stopped by the %.0f s budget" % m["budget_s"]
            if rounds_run < max(m["rounds"], m["e2e_rounds"])
            else "all planned",
        ),
        "- after/peer: the median over rounds of that round's after ÷ peer (times: > 1 is slower than "
        "the peer; busbw: > 1 is faster), so a round run while the machine was slower compares "
        "with its own peer; the before/after/peer columns are medians over rounds",
        "- load: %s at the start, %s at the end (1/5/15-minute load averages); others used median %.0f%%, "
        "max %.0f%% of the machine during the timed windows ('!' above %.0f%%: rerun on a quieter machine)"
        % (
            load[0],
            load[1],
            100 * statistics.median(others) if others else 0,
            100 * max(others, default=0),
            100 * BUSY_LIMIT,
        ),
        "- took %.0f s" % wall_s,
    ]
    out += ["- **%s peer skipped**: %s" % kv for kv in skipped.items()]
    out += [
        "- **failed**: round %d %s %s %s: %s"
        % (r["round"] + 1, r["group"], r["variant"], r["who"], r["error"])
        for r in results
        if r["error"]
    ]
    return out + [""]


def _loadavg():
    return "%.2f %.2f %.2f" % os.getloadavg()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t0, load0 = time.monotonic(), _loadavg()
    results, skipped, rounds_run = run_rounds(args, args.mode["budget_s"])
    wall = time.monotonic() - t0
    text = "\n".join(
        notes(args, results, skipped, rounds_run, wall, (load0, _loadavg())) + table(results, args)
    )
    data = {"trees": args.trees, "mode": args.mode, "results": results, "skipped": skipped}
    _report.write_outputs(args.out_dir, "compare_builds", text, data)
    return 1 if any(r["error"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
