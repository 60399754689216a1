"""ZeRO on a ~100M-parameter GPT, 2 ranks, one compute thread each: step time and per-rank
peak RSS of hvdlite's DDP and ZeRO-1/2/3 next to torch FSDP2, torch's
ZeroRedundancyOptimizer and (where it imports) DeepSpeed.

    python benchmarks/zero_gpt.py                    # every row, 5 timed steps each
    python benchmarks/zero_gpt.py --quick            # 2 steps: a smoke run
    python benchmarks/zero_gpt.py --rows ddp zero3 --steps 10
    python benchmarks/zero_gpt.py --deepspeed-path DIR   # DIR: a `pip install --target` of deepspeed

Model: examples/pytorch_zero_gpt.py's GPT, 12 layers, width 768, 12 heads, vocabulary 16384
(tied head), context 64; batch 4 sequences per rank; AdamW, fp32. Rows:
  ddp          hvd.DistributedOptimizer (allreduce overlapping backward)
  zero1..3     hvd.ZeroOptimizer(stage=1..3)
  zero3-commit zero3 plus hvd.elastic.TorchState(model, opt).commit() after every step (buddy
               copies of the shards in host memory: on one host the buddy maps the owner's
               packed copy; with HVDLITE_BUDDY_SHARED_MEMORY=0 they are sent while the next step
               runs); the commit's share of the step (the training thread's stall) is reported
  zero3-commit-sync  the same with TorchState(..., buddy_overlap=False): each commit waits for
               its buddy exchange (the same as zero3-commit where the copies are mapped)
  fsdp2        torch fully_shard per block and root, gloo, reshard_after_forward=True
  fsdp2-keep   the same with reshard_after_forward=False
  torch-zero   torch DistributedDataParallel + ZeroRedundancyOptimizer (gloo)
  ds1..ds3     DeepSpeed ZeRO stage 1..3, DS_ACCELERATOR=cpu (gloo), fp32
Per step the slowest rank counts; the table shows median and min over steps, the ratio to
ddp, the largest peak RSS over ranks (VmHWM over the timed steps) and the model-state bytes
per rank that ZeRO's accounting predicts (P parameters, N ranks; activations and the
framework's own memory come on top). "others": CPU used by other processes meanwhile.
Writes OUT/zero_gpt.md and .png. Nothing is asserted.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import HERE, add_driver_args, run_job, unavailable
from _report import fmt_others, save_figure, write_outputs

WORKER = os.path.join(HERE, "_zero_gpt_worker.py")
RANKS = 2
# Buddy copies on one host are mapped /dev/shm files (no copy of their own) unless
# HVDLITE_BUDDY_SHARED_MEMORY=0 sends them as across hosts (docs/elastic.md, "ZeRO").
_SHARED = os.environ.get("HVDLITE_BUDDY_SHARED_MEMORY", "1") not in ("0", "false", "False")
_COPIES = "16P/N + %d x 12P/N copies"
# Row -> (launcher, model-state bytes per parameter per rank as f(N), the formula shown).
ROWS = {
    "ddp": ("hvdlite", lambda n: 16.0, "16P"),
    "zero1": ("hvdlite", lambda n: 8 + 12 / n, "8P + 12P/N"),
    "zero2": ("hvdlite", lambda n: 4 + 12 / n, "4P + 12P/N"),
    "zero3": ("hvdlite", lambda n: 16 / n, "16P/N"),
    "zero3-commit": ("hvdlite", lambda n: (40 if _SHARED else 64) / n, _COPIES % (2 if _SHARED else 4)),
    "zero3-commit-sync": ("hvdlite", lambda n: (40 if _SHARED else 52) / n, _COPIES % (2 if _SHARED else 3)),
    "fsdp2": ("gloo", lambda n: 16 / n, "16P/N"),
    "fsdp2-keep": ("gloo", lambda n: 16 / n, "16P/N"),
    "torch-zero": ("gloo", lambda n: 8 + 8 / n, "8P + 8P/N"),
    "ds1": ("deepspeed", None, ""),
    "ds2": ("deepspeed", None, ""),
    "ds3": ("deepspeed", None, ""),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--steps", type=int, default=5)
    add_driver_args(p, idle_wait=10.0, quick="2 steps, no idle wait")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, width-64 model: checks the rows run")
    p.add_argument("--deepspeed-path", help="a directory holding deepspeed (pip install --target)")
    return p.parse_args(argv)


def _deepspeed_env(path):
    """Sets the environment the DeepSpeed rows need; returns why they cannot run, or None."""
    if not path:
        return "not installed here (pass --deepspeed-path DIR with a `pip install --target DIR deepspeed`)"
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)
    import subprocess

    r = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True)
    if r.returncode != 0:
        return "cannot import it: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    return None


def run_row(row, steps, idle_wait, ds_reason, tiny=False):
    lib, per_param, formula = ROWS[row]
    out = {"row": row, "formula": formula}
    reason = ds_reason if lib == "deepspeed" else unavailable(lib)
    if reason:
        return dict(out, skipped=reason)
    launcher = "gloo" if lib == "deepspeed" else lib
    args = ["--mode", row, "--steps", str(steps), "--idle-wait", str(idle_wait)] + (
        ["--tiny"] if tiny else []
    )
    docs, error = run_job(launcher, RANKS, WORKER, args, timeout_s=1200)
    if error or len(docs) != RANKS:
        return dict(out, error=error or "%d of %d ranks wrote results" % (len(docs), RANKS))
    per_step = sorted(max(d["times"][i] for d in docs) for i in range(steps))
    params = docs[0]["params"]
    if "commit_times" in docs[0]:
        commits = sorted(max(d["commit_times"][i] for d in docs) for i in range(steps))
        out.update(
            commit_median_s=commits[len(commits) // 2], commit_min_s=commits[0], commit_max_s=commits[-1]
        )
    return dict(
        out,
        median_s=per_step[len(per_step) // 2],
        min_s=per_step[0],
        peak_rss=max(d["peak_rss"] for d in docs),
        model_state=per_param(RANKS) * params if per_param else None,
        others=docs[0]["load"]["others"],
        version=docs[0]["version"],
        params=params,
    )


def table(results):
    lines = [
        "| row | median step | min step | vs ddp | peak RSS / rank | model state (ZeRO accounting) | others |",
        "|---|---|---|---|---|---|---|",
    ]
    ddp = next((r["median_s"] for r in results if r["row"] == "ddp" and "median_s" in r), None)
    for r in results:
        if "median_s" not in r:
            what = ("skipped: " + r["skipped"]) if "skipped" in r else ("error: " + r["error"])
            lines.append("| %s | %s | | | | | |" % (r["row"], what.replace("|", "/")))
            continue
        ratio = "%.2fx" % (r["median_s"] / ddp) if ddp else ""
        state = "%.2f GB (%s)" % (r["model_state"] / 1e9, r["formula"]) if r["model_state"] else ""
        lines.append(
            "| %s | %.2f s | %.2f s | %s | %.2f GB | %s | %s |"
            % (
                r["row"],
                r["median_s"],
                r["min_s"],
                ratio,
                r["peak_rss"] / 1e9,
                state,
                fmt_others(r["others"]),
            )
        )
    return lines


def commit_lines(results):
    """The commit's cost where a row measured it, against the step of the same row without it."""
    lines = []
    for r in results:
        if "commit_median_s" not in r:
            continue
        base = next((b for b in results if b["row"] == r["row"].split("-")[0] and "median_s" in b), None)
        share = r["commit_median_s"] / (r["median_s"] - r["commit_median_s"])
        lines += [
            "",
            "%s: commit (buddy copies) median %.3f s (min %.3f, max %.3f) = %.1f%% of the step without it"
            % (r["row"], r["commit_median_s"], r["commit_min_s"], r["commit_max_s"], 100 * share),
        ]
        if base:
            lines[-1] += "; the %s row's median step: %.2f s, this row's %.2f s (%.2fx)" % (
                base["row"],
                base["median_s"],
                r["median_s"],
                r["median_s"] / base["median_s"],
            )
    return lines


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if "median_s" in r]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.bar([r["row"] for r in rows], [r["median_s"] for r in rows], color="tab:blue")
    a.set_ylabel("median step (s)")
    b.bar([r["row"] for r in rows], [r["peak_rss"] / 1e9 for r in rows], color="tab:orange", label="peak RSS")
    b.scatter(
        [r["row"] for r in rows if r["model_state"]],
        [r["model_state"] / 1e9 for r in rows if r["model_state"]],
        color="black",
        marker="_",
        s=400,
        label="model state",
    )
    b.set_ylabel("GB per rank")
    b.legend()
    for ax in (a, b):
        ax.tick_params(axis="x", labelrotation=30)
    save_figure(
        fig, path, "GPT (%.0fM parameters), 2 ranks, 1 thread each" % (rows[0]["params"] / 1e6 if rows else 0)
    )


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    steps = 2 if args.quick else args.steps
    idle_wait = 0.0 if args.quick else args.idle_wait
    ds_reason = None
    if any(ROWS[r][0] == "deepspeed" for r in args.rows):
        ds_reason = _deepspeed_env(args.deepspeed_path)
    results = []
    for row in args.rows:
        results.append(run_row(row, steps, idle_wait, ds_reason, args.tiny))
        print("  %s" % results[-1], flush=True)
    params = next((r["params"] for r in results if "params" in r), 0)
    versions = sorted({r["version"] for r in results if "version" in r})
    text = "\n".join(
        [
            "# ZeRO on a GPT of %.1fM parameters, %d ranks" % (params / 1e6, RANKS),
            "",
            "One compute thread per rank, %d cores, %d timed steps per row; %s."
            % (os.cpu_count() or 1, steps, "; ".join(versions)),
            "",
        ]
        + table(results)
        + commit_lines(results)
    )
    write_outputs(args.out_dir, "zero_gpt", text, {"results": results}, lambda path: plot(results, path))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
