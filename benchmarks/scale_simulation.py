"""The control plane of an N-rank job, simulated in one process (issue 29 part 5): CPU per
step (rank 0's and the mean over ranks) and control messages per rank per step, for a
ResNet-50 step (161 float32 allreduces), in negotiation and in the steady state.

    python benchmarks/scale_simulation.py                 # N = 2, 16, 128, 1024, 16384
    python benchmarks/scale_simulation.py --ranks 2,16,128 --steps 20
    python benchmarks/scale_simulation.py --quick         # N = 2, 16, 128, 3 steps: a smoke run

Drives the real coordinator (response cache, schedule learner, deadlock detector), each
rank's request cache and steady-state vote tree over serialized messages, with no sockets
(tests/cpp/scale_sim.h; the binary is benchmarks/scale_simulation.cc, built into build/).
Phases: negotiation_first (nothing cached), negotiation_second (full requests again: the
tensors are cached now), negotiation_cached (cache hits: 4 bytes a request, every member the
same id: the cached decision is replayed), negotiation_blocked (every rank also reports a blocked caller: the deadlock
detector's input), steady (schedule mode: one vote per fused group on the tree). CPU is
thread CPU time; messages count each message at its sender and at its receiver. Writes
OUT/scale_simulation.md and OUT/scale_simulation.json, OUT = --out-dir (benchmarks/results).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _resnet50_shapes import resnet50_shapes  # noqa: E402

BUILD = os.path.join(ROOT, "build")
PHASES = ("negotiation_first", "negotiation_second", "negotiation_cached", "negotiation_blocked", "steady")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,16,128,1024,16384", help="comma-separated simulated rank counts")
    p.add_argument("--steps", type=int, default=20, help="steady-state steps per N (median and range)")
    p.add_argument("--quick", action="store_true", help="smoke run: N = 2, 16, 128, 3 steady steps")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.ranks, args.steps = "2,16,128", 3
    return args


def build_binary():
    if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
        sys.exit("the CMake build tree build/ is missing: build the core first (make install)")
    subprocess.run(["cmake", "--build", BUILD, "--target", "scale_simulation", "-j", "2"], check=True)
    return os.path.join(BUILD, "scale_simulation")


def simulate(binary, ranks, steps):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for shape in resnet50_shapes():
            f.write(",".join(str(d) for d in shape) + "\n")
        shapes = f.name
    rows = []
    try:
        for n in ranks:  # one process per N: each N's memory is returned before the next
            run = subprocess.run(
                [binary, shapes, str(steps), str(n)], capture_output=True, text=True, check=True
            )
            for line in run.stdout.splitlines():
                rows.append(json.loads(line))
                print(line, flush=True)
    finally:
        os.unlink(shapes)
    return rows


def _us(seconds):
    return "%.1f" % (seconds * 1e6) if seconds < 0.01 else "%.0f" % (seconds * 1e6)


def exponent(rows, phase, key):
    """Growth exponent of `key` over N from the smallest to the largest N (log-log slope)."""
    pts = sorted((r["n"], r[key]) for r in rows if r["phase"] == phase and r[key] > 0)
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return float("nan")
    (n0, v0), (n1, v1) = pts[0], pts[-1]
    return math.log(v1 / v0) / math.log(n1 / n0)


def table(rows):
    lines = [
        "| phase | N | rank 0 CPU/step µs (min-max) | mean CPU/rank/step µs | msgs/rank/step | "
        "rank 0 msgs/step | max msgs/rank | positions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for phase in PHASES:
        for r in sorted((r for r in rows if r["phase"] == phase), key=lambda r: r["n"]):
            lines.append(
                "| %s | %d | %s (%s-%s) | %s | %.2f | %d | %d | %d |"
                % (
                    phase,
                    r["n"],
                    _us(r["rank0_cpu_s"]),
                    _us(r["rank0_cpu_min_s"]),
                    _us(r["rank0_cpu_max_s"]),
                    _us(r["mean_cpu_s"]),
                    r["messages_per_rank"],
                    r["rank0_messages"],
                    r["max_messages"],
                    r["positions"],
                )
            )
    lines.append("")
    lines.append("Growth exponents over N (log-log slope, smallest to largest N):")
    lines.append("")
    for phase in PHASES:
        lines.append(
            "- %s: rank 0 CPU N^%.2f, mean CPU N^%.2f, max messages per rank N^%.2f"
            % (
                phase,
                exponent(rows, phase, "rank0_cpu_s"),
                exponent(rows, phase, "mean_cpu_s"),
                exponent(rows, phase, "max_messages"),
            )
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    ranks = [int(n) for n in args.ranks.split(",")]
    rows = simulate(build_binary(), ranks, args.steps)
    errors = sum(r["errors"] for r in rows)
    os.makedirs(args.out_dir, exist_ok=True)
    report = "# Control-plane simulation: ResNet-50 step (161 tensors)\n\n" + table(rows)
    if errors:
        report += "\n**%d simulated ranks reported errors**\n" % errors
    with open(os.path.join(args.out_dir, "scale_simulation.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out_dir, "scale_simulation.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(report)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
