"""Every benchmark in one run, and one Markdown report: what `make bench` runs.

    python benchmarks/_suite.py              # the default: about 15 minutes on 2 cores
    python benchmarks/_suite.py --full       # the long sweep (each script's own defaults: hours)
    python benchmarks/_suite.py --quick      # each script's smoke mode (a few minutes)
    BENCH_FULL=1 make bench                  # = --full

Runs each benchmark script (SUITE) in turn as its own process, with the arguments of the
chosen mode, writing into OUT (--out-dir, benchmarks/results); then writes OUT/report.md:
a summary table with every ratio of hvdlite against its peer (read from each script's
OUT/<name>.json), then each script's own tables (OUT/<name>.md) and plots (OUT/<name>.png).
A script that fails or is cut off by its time limit is reported as such; the others still
run. Exit status: 1 when any script failed, else 0. Nothing is asserted about speed.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import HERE, host_line
from _summary import report

# name -> (default arguments, time limit in seconds for the default). The default mode fits
# the 2-core machines in about 12 minutes: fewer sizes, ranks and repetitions than --full, the
# same peers, a short wait for an idle machine (the "others" columns show the load). And it
# never runs past DEFAULT_BUDGET_S: each script's limit is cut to what is left of the budget,
# and a script with less than MIN_SLOT_S left is not started (the report says so).
# --full passes no arguments (each script's own defaults are its full sweep) and gives each
# script FULL_LIMIT_S; --quick passes --quick.
SUITE = {
    "collectives": (["--sizes", "4K,1M,16M", "--ranks", "2", "--reps", "10", "--idle-wait", "1"], 240),
    "fusion": (["--ranks", "2", "--reps", "8", "--idle-wait", "3"], 150),
    "e2e_torch": (["--steps", "5", "--idle-wait", "3"], 240),
    "e2e_tf": (["--steps", "5", "--idle-wait", "3"], 150),
    # ~100M GPT: a step takes 5-15 s here, so the default times ZeRO-3 against FSDP2 only
    "zero_gpt": (["--rows", "zero3", "fsdp2", "--steps", "2", "--idle-wait", "0"], 240),
    "pipeline_bubble": (["--steps", "2"], 60),
    "pipeline_vs_torch": (["--steps", "3"], 90),
    "torch_backend": (["--reps", "8", "--rounds", "3", "--steps", "3", "--idle-wait", "3"], 150),
    # simulated hosts (needs root; without it the script writes why and exits 0): the MLP goal run
    "slow_links": (["--goal"], 180),
}
DEFAULT_BUDGET_S = 14.5 * 60
MIN_SLOT_S = 30
FULL_LIMIT_S = 3 * 3600
QUICK_LIMIT_S = 600
STOP_GRACE_S = 30.0  # a cut-off script's time to stop its jobs (run_job waits 10 s per signal)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", default=os.environ.get("BENCH_FULL") == "1")
    mode.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="+", choices=list(SUITE), default=list(SUITE), help="a subset")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    return p.parse_args(argv)


def run_one(name, args, left_s):
    """Runs one script within min(its limit, left_s); returns (exit code or a reason, seconds)."""
    extra, limit = SUITE[name]
    if args.full:
        extra, limit = [], FULL_LIMIT_S
    elif args.quick:
        extra, limit = ["--quick"], QUICK_LIMIT_S
    else:
        if left_s < MIN_SLOT_S:
            return "not run: the %.0f-minute budget was spent" % (DEFAULT_BUDGET_S / 60), 0.0
        limit = min(limit, left_s)
    cmd = [sys.executable, os.path.join(HERE, name + ".py")] + extra + ["--out-dir", args.out_dir]
    print("== %s" % " ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        _stop(proc)
        code = "cut off after %.0f s" % limit
    except BaseException:
        _stop(proc)
        raise
    return code, time.monotonic() - t0


def _stop(proc):
    """SIGINT first: the script's run_job stops its launchers' process groups (they run in
    sessions of their own) on KeyboardInterrupt; SIGKILL to the script's group STOP_GRACE_S later."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out_dir, exist_ok=True)
    for name in args.only:  # an old result must not pass for this run's
        for ext in (".md", ".json", ".png"):
            path = os.path.join(args.out_dir, name + ext)
            if os.path.exists(path):
                os.unlink(path)
    t0, outcomes = time.monotonic(), {}
    for name in args.only:
        outcomes[name] = run_one(name, args, DEFAULT_BUDGET_S - (time.monotonic() - t0))
    mode = "full" if args.full else ("quick" if args.quick else "default")
    path = os.path.join(args.out_dir, "report.md")
    with open(path, "w") as f:
        f.write(report(args.out_dir, args.only, outcomes, mode, time.monotonic() - t0, host_line()) + "\n")
    print("wrote %s (%s mode, %.0f s)" % (path, mode, time.monotonic() - t0), flush=True)
    return 1 if any(code != 0 for code, _ in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
