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
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import HERE, host_line
from _summary import report

# name -> (default arguments, time limit in seconds for the default). The default mode keeps
# the whole suite under 15 minutes on the 2-core machines (with Horovod built): fewer sizes,
# ranks and repetitions than --full, the same peers. --full passes no arguments (each script's
# own defaults are its full sweep) and gives each script 3 hours; --quick passes --quick.
SUITE = {
    "collectives": (["--sizes", "4K,64K,1M,16M", "--ranks", "2", "--reps", "10", "--idle-wait", "5"], 300),
    "fusion": (["--ranks", "2", "--reps", "8", "--idle-wait", "5"], 180),
    "e2e_torch": (["--steps", "8", "--idle-wait", "5"], 240),
    "e2e_tf": (["--steps", "8", "--idle-wait", "5"], 150),
    "zero_gpt": (["--rows", "ddp", "zero1", "zero2", "zero3", "fsdp2", "torch-zero", "--steps", "2"], 240),
    "pipeline_bubble": (["--steps", "2"], 60),
    "pipeline_vs_torch": (["--steps", "3"], 90),
}
FULL_LIMIT_S = 3 * 3600
QUICK_LIMIT_S = 600


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", default=os.environ.get("BENCH_FULL") == "1")
    mode.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="+", choices=list(SUITE), default=list(SUITE), help="a subset")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    return p.parse_args(argv)


def run_one(name, args):
    """Runs one script; returns (exit code or a reason string, seconds)."""
    extra, limit = SUITE[name]
    if args.full:
        extra, limit = [], FULL_LIMIT_S
    elif args.quick:
        extra, limit = ["--quick"], QUICK_LIMIT_S
    cmd = [sys.executable, os.path.join(HERE, name + ".py")] + extra + ["--out-dir", args.out_dir]
    print("== %s" % " ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the script, its launchers and their ranks
        proc.wait()
        code = "cut off after %d s" % limit
    except BaseException:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise
    return code, time.monotonic() - t0


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
        outcomes[name] = run_one(name, args)
    mode = "full" if args.full else ("quick" if args.quick else "default")
    path = os.path.join(args.out_dir, "report.md")
    with open(path, "w") as f:
        f.write(report(args.out_dir, args.only, outcomes, mode, time.monotonic() - t0, host_line()) + "\n")
    print("wrote %s (%s mode, %.0f s)" % (path, mode, time.monotonic() - t0), flush=True)
    return 1 if any(code != 0 for code, _ in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
