"""End-to-end PyTorch training step time: hvdlite's DistributedOptimizer against the peers.

    python benchmarks/e2e_torch.py [--models mlp cnn] [--steps 20] [--quick]

Issue 4's table, two models with batch 32 per rank:
  mlp  64 -> 4096 -> 4096 -> 2048 -> 10 (25.4M parameters, 102 MB of float32 gradients)
  cnn  the small CNN of examples/pytorch_digits.py on 8x8 images (24k parameters)
and five ways to run them, all in this one invocation:
  single      1 process, no hvdlite
  nocomm      2 processes side by side, each training alone (the floor for 2 ranks)
  hvdlite     2 ranks, hvdliterun, hvd.DistributedOptimizer (overlapping allreduce)
  hvdlite-fp16  the same with compression=hvd.Compression.fp16 (half the bytes)
  ddp         2 ranks, torch DistributedDataParallel over gloo
  horovod     2 ranks, horovod.torch (only when `import horovod.torch` works here)
Every rank uses one compute thread. Each timed step starts after a barrier (nocomm: none);
per step the slowest rank counts; the table shows the median (and min) over steps and the
ratio to nocomm. Before each case the driver waits (at most 60 s) for an idle machine and
reports the CPU that other processes used during it (/proc/stat minus this job's own
rusage); above 10% the row is flagged. Results: stdout, benchmarks/results/e2e_torch.md and
.png. Nothing is asserted: speed is a benchmark, not a test.
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_e2e_torch_worker.py")
RESULTS = os.path.join(HERE, "results")
MODES = ("single", "nocomm", "hvdlite", "hvdlite-fp16", "ddp", "horovod")
BUSY_LIMIT = 0.10
_TICK = os.sysconf("SC_CLK_TCK")
_NCPU = os.cpu_count() or 1


def machine_busy_seconds():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK


def wait_for_idle(max_wait_s=60.0, window_s=0.5):
    """Waits until others use < BUSY_LIMIT of the machine over a window; returns that share."""
    deadline = time.monotonic() + max_wait_s
    while True:
        before = machine_busy_seconds()
        time.sleep(window_s)
        share = (machine_busy_seconds() - before) / (window_s * _NCPU)
        if share < BUSY_LIMIT or time.monotonic() > deadline:
            return share


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra or {})
    return env


def _commands(mode, model, steps, out_dir):
    """[(argv, env)] of the processes one case starts, all at once."""
    base = [sys.executable, WORKER, "--mode", mode, "--model", model, "--steps", str(steps), "--out", out_dir]
    if mode == "single":
        return [(base, _env({"RANK": "0", "WORLD_SIZE": "1"}))]
    if mode == "nocomm":
        return [(base, _env({"RANK": str(r), "WORLD_SIZE": "2"})) for r in range(2)]
    if mode.startswith("hvdlite"):
        return [([sys.executable, "-m", "hvdlite.runner.launch", "-np", "2"] + base, _env())]
    port = str(free_port())
    if mode == "ddp":
        return [(base, _env({"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}))
                for r in range(2)]
    return [(["horovodrun", "--gloo", "-np", "2", "-H", "localhost:2"] + base, _env())]


def _collect(procs, timeout_s):
    """Every process's output; a process still running after timeout_s (all together) is
    killed, with its output ending in a line that says so."""
    deadline = time.monotonic() + timeout_s
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outputs.append((p.communicate()[0] or "") + "\ntimed out after %.0f s" % timeout_s)
    return outputs


def run_case(mode, model, steps, timeout_s=300):
    """Runs one case; returns a result dict (or one with 'error')."""
    with tempfile.TemporaryDirectory() as out_dir:
        idle_before = wait_for_idle()
        busy0, own0, t0 = machine_busy_seconds(), children_cpu_seconds(), time.monotonic()
        procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for argv, env in _commands(mode, model, steps, out_dir)]
        outputs = _collect(procs, timeout_s)
        wall = time.monotonic() - t0
        others = (machine_busy_seconds() - busy0 - (children_cpu_seconds() - own0)) / (wall * _NCPU)
        if any(p.returncode for p in procs):
            failed = next(o for p, o in zip(procs, outputs) if p.returncode)
            return {"mode": mode, "model": model, "error": (failed.strip().splitlines() or ["exit code"])[-1]}
        ranks = []
        for name in sorted(os.listdir(out_dir)):
            with open(os.path.join(out_dir, name)) as f:
                ranks.append(json.load(f))
    per_step = [max(r["step_s"][i] for r in ranks) for i in range(min(len(r["step_s"]) for r in ranks))]
    per_step.sort()
    return {"mode": mode, "model": model, "median_s": per_step[len(per_step) // 2], "min_s": per_step[0],
            "others": max(0.0, others), "idle_before": idle_before, "params": ranks[0]["params"]}


def horovod_available():
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True)
    return probe.returncode == 0


def table(results):
    lines = ["| model | mode | median step | min step | vs nocomm | others' CPU |", "|---|---|---|---|---|---|"]
    floor = {r["model"]: r["median_s"] for r in results if r["mode"] == "nocomm" and "median_s" in r}
    for r in results:
        if "median_s" not in r:
            lines.append("| %s | %s | %s | | | |" % (r["model"], r["mode"], r.get("error") or r.get("skipped")))
            continue
        ratio = r["median_s"] / floor[r["model"]] if r["model"] in floor else float("nan")
        flag = " (busy)" if r["others"] > BUSY_LIMIT else ""
        lines.append("| %s | %s | %.1f ms | %.1f ms | %.2fx | %.0f%%%s |" % (
            r["model"], r["mode"], r["median_s"] * 1e3, r["min_s"] * 1e3, ratio, r["others"] * 100, flag))
    return "\n".join(lines)


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    models = sorted({r["model"] for r in results})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = [r for r in results if r["model"] == model and "median_s" in r]
        ax.bar([r["mode"] for r in rows], [r["median_s"] * 1e3 for r in rows], color="tab:blue")
        ax.set_title("%s, batch 32/rank, 2 ranks" % model)
        ax.set_ylabel("median step (ms)")
    fig.tight_layout()
    fig.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"])
    parser.add_argument("--steps", type=int, default=0, help="timed steps (default: 20 mlp, 100 cnn)")
    parser.add_argument("--quick", action="store_true", help="few steps: a smoke run")
    args = parser.parse_args()
    has_horovod = horovod_available()
    results = []
    for model in args.models:
        steps = args.steps or (3 if args.quick else (20 if model == "mlp" else 100))
        for mode in MODES:
            if mode == "horovod" and not has_horovod:
                results.append({"mode": mode, "model": model, "skipped": "not installed here"})
                continue
            results.append(run_case(mode, model, steps))
            print(json.dumps(results[-1]), flush=True)
    text = table(results)
    notes = ("2 ranks on %d cores, one compute thread per rank; torch %s. Shared machine: rows marked "
             "(busy) ran while other processes used > %d%% of it." % (_NCPU, _torch_version(), BUSY_LIMIT * 100))
    print("\n" + text + "\n\n" + notes)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "e2e_torch.md"), "w") as f:
        f.write("# End-to-end PyTorch step time\n\n" + text + "\n\n" + notes + "\n")
    plot(results, os.path.join(RESULTS, "e2e_torch.png"))


def _torch_version():
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                         text=True)
    return out.stdout.strip()


if __name__ == "__main__":
    main()
