"""End-to-end PyTorch training step time: hvdlite's DistributedOptimizer against the peers.

    python benchmarks/e2e_torch.py               # both models, 20 (mlp) / 100 (cnn) timed steps
    python benchmarks/e2e_torch.py --quick       # 3 steps each: a smoke run
    python benchmarks/e2e_torch.py --models mlp --steps 30

Issue 4's table, batch 32 per rank, one compute thread per rank:
  mlp  64 -> 4096 -> 4096 -> 2048 -> 10 (25.4M parameters, 102 MB of float32 gradients)
  cnn  the small CNN of examples/pytorch_digits.py on 8x8 images (38k parameters)
Rows (the 2-rank ones side by side on the 2 cores):
  single        1 process, no communication
  nocomm        2 processes, each training alone (the floor for 2 ranks)
  hvdlite       hvd.DistributedOptimizer (allreduce overlapping backward)
  hvdlite-fp16  the same with Compression.fp16
  ddp           torch DistributedDataParallel over gloo
  horovod       Horovod 0.28.1's DistributedOptimizer, where `make horovod` built it
Each timed step starts after a barrier; per step the slowest rank counts; the table shows the
median and min over steps and the ratio to nocomm. Before timing, the ranks wait (at most
--idle-wait s) for an idle machine; "others" is the CPU other processes used meanwhile (!
above 10%: re-run). Writes OUT/e2e_torch.md and .png (OUT = --out-dir, benchmarks/results).
Nothing is asserted: speed is a benchmark, not a test.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import HERE, add_driver_args, run_job, unavailable
from _report import fmt_others, save_figure, write_outputs

WORKER = os.path.join(HERE, "_e2e_torch_worker.py")
# Row -> (library that launches it, ranks, worker mode).
ROWS = {
    "single": ("hvdlite", 1, "alone"),
    "nocomm": ("hvdlite", 2, "alone"),
    "hvdlite": ("hvdlite", 2, "train"),
    "hvdlite-fp16": ("hvdlite", 2, "fp16"),
    "ddp": ("gloo", 2, "train"),
    "horovod": ("horovod", 2, "train"),
}
STEPS = {"mlp": 20, "cnn": 100}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=sorted(STEPS))
    p.add_argument("--steps", type=int, help="timed steps per row (default: 20 mlp, 100 cnn)")
    add_driver_args(p, idle_wait=30.0, quick="3 steps, 2 s idle wait: a smoke run")
    return p.parse_args(argv)


def run_row(row, model, steps, idle_wait, rows=None, worker=WORKER, env=None):
    """One row: {'row', 'model', and 'median_s', 'min_s', 'others', 'version' | 'skipped' | 'error'}.
    `rows` / `worker`: another framework's table and worker with the same contract (e2e_tf.py);
    `env`: extra variables for the job (run_job's)."""
    lib, ranks, mode = (rows or ROWS)[row]
    out = {"row": row, "model": model}
    reason = unavailable(lib)
    if reason:
        return dict(out, skipped=reason)
    args = ["--mode", mode, "--model", model, "--steps", str(steps), "--idle-wait", str(idle_wait)]
    docs, error = run_job(lib, ranks, worker, args, timeout_s=600, env=env)
    if error or len(docs) != ranks:
        return dict(out, error=error or "%d of %d ranks wrote results" % (len(docs), ranks))
    per_step = sorted(max(d["times"][i] for d in docs) for i in range(steps))
    return dict(
        out,
        median_s=per_step[len(per_step) // 2],
        min_s=per_step[0],
        others=docs[0]["load"]["others"],
        version=docs[0]["version"],
        params=docs[0]["params"],
    )


def table(results):
    lines = ["| model | row | median step | min step | vs nocomm | others |", "|---|---|---|---|---|---|"]
    floor = {r["model"]: r["median_s"] for r in results if r["row"] == "nocomm" and "median_s" in r}
    for r in results:
        if "median_s" not in r:
            what = ("skipped: " + r["skipped"]) if "skipped" in r else ("error: " + r["error"])
            lines.append("| %s | %s | %s | | | |" % (r["model"], r["row"], what.replace("|", "/")))
            continue
        ratio = "%.2fx" % (r["median_s"] / floor[r["model"]]) if r["model"] in floor else ""
        lines.append(
            "| %s | %s | %.1f ms | %.1f ms | %s | %s |"
            % (r["model"], r["row"], r["median_s"] * 1e3, r["min_s"] * 1e3, ratio, fmt_others(r["others"]))
        )
    return lines


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in results})
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = [r for r in results if r["model"] == model and "median_s" in r]
        ax.bar([r["row"] for r in rows], [r["median_s"] * 1e3 for r in rows], color="tab:blue")
        ax.set_title("%s, batch 32 per rank" % model)
        ax.set_ylabel("median step (ms)")
        ax.tick_params(axis="x", labelrotation=30)
    save_figure(fig, path)


def write_report(results, out_dir, stem, framework, threads):
    """Prints the table and writes OUT/<stem>.md, .json and .png (shared with e2e_tf.py)."""
    versions = sorted({r["version"] for r in results if "version" in r})
    text = "\n".join(
        [
            "# End-to-end %s step time" % framework,
            "",
            "%s, %d cores; %s." % (threads, os.cpu_count() or 1, "; ".join(versions)),
            "",
        ]
        + table(results)
    )
    write_outputs(out_dir, stem, text, {"results": results}, lambda path: plot(results, path))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    idle_wait = 2.0 if args.quick else args.idle_wait
    results = []
    for model in args.models:
        steps = 3 if args.quick else (args.steps or STEPS[model])
        for row in ROWS:
            results.append(run_row(row, model, steps, idle_wait))
            print("  %s" % results[-1], flush=True)
    write_report(results, args.out_dir, "e2e_torch", "PyTorch", "One compute thread per rank")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
