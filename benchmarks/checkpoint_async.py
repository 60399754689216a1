"""Stall of an asynchronous ZeRO checkpoint next to a blocking one: zero_gpt.py's ~100M-parameter
GPT (AdamW, fp32), 2 ranks, one compute thread each.

    python benchmarks/checkpoint_async.py                  # ZeRO-3, 3 repetitions
    python benchmarks/checkpoint_async.py --stage 1 --reps 5 --dir /mnt/fast
    python benchmarks/checkpoint_async.py --quick          # a 2-layer model: a smoke run

Per repetition (the slowest rank counts): the time hvd.save_checkpoint(blocking=True) takes,
the time hvd.save_checkpoint(blocking=False) takes (the stall: agreeing on the folder and copying
this rank's shards to host memory), the training steps that run while the write goes on next to
steps with no write pending, and the wait_checkpoint() after them. Every file is fsynced, so the
blocking time includes the disk. Writes OUT/checkpoint_async.md and .json. Nothing is asserted.
"""

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import HERE, add_driver_args, host_line, run_job
from _report import fmt_others, write_outputs

WORKER = os.path.join(HERE, "_checkpoint_worker.py")
RANKS = 2


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", type=int, default=3, choices=(1, 2, 3))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="training steps timed per part")
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    add_driver_args(p, idle_wait=10.0, quick="a 2-layer, width-64 model, 1 repetition")
    return p.parse_args(argv)


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def summarize(docs):
    """Per repetition the slowest rank; medians (and mins) over repetitions."""
    reps = len(docs[0]["blocking"])

    def worst(key, i):
        return max(d[key][i] for d in docs)

    def steps(key, i):
        return sum(max(d[key][i][j] for d in docs) for j in range(len(docs[0][key][i]))) / len(
            docs[0][key][i]
        )

    s = {
        "blocking": [worst("blocking", i) for i in range(reps)],
        "stall": [worst("stall", i) for i in range(reps)],
        "wait": [worst("wait", i) for i in range(reps)],
        "plain_step": [steps("plain_steps", i) for i in range(reps)],
        "step_during": [steps("steps_during", i) for i in range(reps)],
        "still_writing": [any(d["still_writing"][i] for d in docs) for i in range(reps)],
    }
    return dict(
        {k: _median(v) for k, v in s.items() if k != "still_writing"},
        mins={k: min(v) for k, v in s.items() if k != "still_writing"},
        all=s,
        params=docs[0]["params"],
        bytes=docs[0]["bytes"],
        others=docs[0]["load"]["others"],
        version=docs[0]["version"],
    )


def report(r, args):
    rows = [
        ("blocking save", r["blocking"], "1.00"),
        ("asynchronous save: the call (stall)", r["stall"], "%.3f" % (r["stall"] / r["blocking"])),
        ("wait_checkpoint() after %d steps" % args.steps, r["wait"], ""),
        ("training step, no write pending", r["plain_step"], ""),
        (
            "training step while the write runs",
            r["step_during"],
            "%.2f x the plain step" % (r["step_during"] / r["plain_step"]),
        ),
    ]
    lines = [
        "# Asynchronous vs blocking ZeRO-%d checkpoint, GPT of %.1fM parameters, %d ranks"
        % (args.stage, r["params"] / 1e6, RANKS),
        "",
        host_line(),
        "- %s; one compute thread per rank; checkpoint %.2f GB on disk (every file fsynced); "
        "%d repetitions, medians of the slowest rank; others: %s"
        % (r["version"], r["bytes"] / 1e9, len(r["all"]["blocking"]), fmt_others(r["others"])),
        "- the write was still running after the %d steps in %d of %d repetitions"
        % (args.steps, sum(r["all"]["still_writing"]), len(r["all"]["blocking"])),
        "",
        "| what | median | min | vs blocking save |",
        "|---|---|---|---|",
    ]
    keys = ["blocking", "stall", "wait", "plain_step", "step_during"]
    for (what, value, ratio), key in zip(rows, keys):
        lines.append("| %s | %.3f s | %.3f s | %s |" % (what, value, r["mins"][key], ratio))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    folder = args.dir or tempfile.mkdtemp(prefix="hvdlite-ckpt-bench-")
    extra = ["--stage", str(args.stage), "--steps", str(args.steps), "--dir", folder]
    extra += (
        ["--reps", "1", "--tiny", "--idle-wait", "0"]
        if args.quick
        else ["--reps", str(args.reps), "--idle-wait", str(args.idle_wait)]
    )
    try:
        docs, error = run_job("hvdlite", RANKS, WORKER, extra, timeout_s=1800)
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    if error or len(docs) != RANKS:
        print("error: %s" % (error or "%d of %d ranks wrote results" % (len(docs), RANKS)))
        return 1
    result = summarize(docs)
    write_outputs(args.out_dir, "checkpoint_async", report(result, args), {"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
