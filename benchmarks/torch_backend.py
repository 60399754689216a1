"""torch.distributed on the "hvdlite" backend against gloo, side by side in one job:

    python benchmarks/torch_backend.py [--sizes 4K,1M,64M] [--reps 15] [--rounds 3] [--steps 4]
    sudo python benchmarks/torch_backend.py --hosts 2 [--rate 10gbit]   # simulated hosts (root)

One job of 2 ranks (hvdliterun): the default group is hvdlite's, and a gloo group of the same
ranks sits beside it (dist.new_group(backend="gloo")). Every measurement alternates the two
groups, so drift in the machine's load reaches both:

- all_reduce (float32, in place): a correctness pass with rank-dependent data first (#wrong),
  then per size --reps repetitions per group, each after a barrier, K back-to-back calls for
  messages up to 1 MiB; a repetition's time is the slowest rank's. Latency and bus bandwidth
  (nccl-tests' busbw = bytes / time x 2(n-1)/n), medians, and gloo's time over hvdlite's
  (median and range over repetitions).
- per-call cost of the backend: dist.all_reduce of one float on hvdlite against hvd.allreduce_
  of the same tensor through hvdlite's own API, in the same job (the difference, in us).
- whole-model steps of a 25M-parameter MLP (batch 32 per rank, SGD): the step without any
  communication, DDP over each group, FSDP2 (fully_shard on a mesh of each group); --rounds
  rounds, each timing --steps steps of every variant in turn; ratios to the step without
  communication and hvdlite's step over gloo's, median and range over rounds.

Every rank has one compute thread. Rank 0 waits for an idle machine first and reports the
CPU share others used during the measurement. Writes OUT/torch_backend.md and .json.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import HERE, host_line, run_job
from _machine import BUSY_LIMIT, Gate
from _report import fmt_others, fmt_size, fmt_time, write_outputs

SCRIPT = os.path.abspath(__file__)
SMALL = 1 << 20  # messages up to this size: K back-to-back calls per repetition
K_SMALL = 50
PER_CALL_K = 400


def _parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


# ---- rank side ----


def _slowest(dist, gloo, seconds):
    """The slowest rank's time (a gloo all_reduce outside every timed region)."""
    import torch

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return t.item()


def _time_calls(dist, group, gloo, fn, k):
    dist.barrier(group=gloo)
    start = time.perf_counter()
    for _ in range(k):
        fn()
    return _slowest(dist, gloo, (time.perf_counter() - start) / k)


def _allreduce_rows(dist, gloo, sizes, reps):
    import torch

    r, n = dist.get_rank(), dist.get_world_size()
    rows = []
    for size in sizes:
        x = torch.zeros(size // 4)
        check = [torch.arange(size // 4, dtype=torch.float32) * (r + 1) for _ in range(2)]
        dist.all_reduce(check[0])
        dist.all_reduce(check[1], group=gloo)
        wrong = int((check[0] != check[1]).sum().item())
        k = K_SMALL if size <= SMALL else 1
        times = {"hvdlite": [], "gloo": []}
        for rep in range(reps + 1):  # the first repetition warms up
            order = (("hvdlite", None), ("gloo", gloo)) if rep % 2 else (("gloo", gloo), ("hvdlite", None))
            for lib, group in order:
                t = _time_calls(dist, group, gloo, lambda g=group, x=x: dist.all_reduce(x, group=g), k)
                if rep:
                    times[lib].append(t)
        ratios = [g / h for g, h in zip(times["gloo"], times["hvdlite"])]
        rows.append({"bytes": size, "n": n, "wrong": wrong, "times": times, "ratios": ratios})
    return rows


def _per_call_cost(dist, gloo, hvd, reps):
    import torch

    x = torch.zeros(1)
    backend, own = [], []
    for rep in range(reps + 1):
        b = _time_calls(dist, None, gloo, lambda: dist.all_reduce(x), PER_CALL_K)
        o = _time_calls(dist, None, gloo, lambda: hvd.allreduce_(x, name="per_call", op=hvd.Sum), PER_CALL_K)
        if rep:
            backend.append(b)
            own.append(o)
    return {"backend": backend, "own": own}


def _mlp(width, layers):
    import torch
    from torch import nn

    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods)


def _step_fn(model, batch, width):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    step()  # buckets, shapes and first negotiation: not timed
    return step


def _model_variants(dist, gloo, width, layers, batch):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = {"no communication": _step_fn(_mlp(width, layers), batch, width)}
    for lib, group in (("gloo", gloo), ("hvdlite", dist.group.WORLD)):
        out["DDP " + lib] = _step_fn(DDP(_mlp(width, layers), process_group=group), batch, width)
        model = _mlp(width, layers)
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if hasattr(layer, "weight"):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        out["FSDP2 " + lib] = _step_fn(model, batch, width)
    return out


def _model_rounds(dist, gloo, args):
    variants = _model_variants(dist, gloo, args.width, args.layers, args.batch)
    times = {name: [] for name in variants}
    for rnd in range(args.rounds):
        names = list(variants) if rnd % 2 == 0 else list(reversed(variants))
        for name in names:
            times[name].append(_time_calls(dist, None, gloo, variants[name], args.steps))
    params = sum(p.numel() for p in _mlp(args.width, args.layers).parameters())
    return {"params": params, "times": times}


def worker(args):
    import torch
    import torch.distributed as dist

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    dist.init_process_group("hvdlite")
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    gate = Gate(os.path.join(args.out, "gate"), r, n)
    idle = gate.wait_idle(args.idle_wait)
    meter = gate.meter() if r == 0 else None
    if meter:
        meter.start()
    doc = {"rank": r, "idle": idle}
    doc["allreduce"] = _allreduce_rows(dist, gloo, [_parse_size(s) for s in args.sizes.split(",")], args.reps)
    doc["per_call"] = _per_call_cost(dist, gloo, hvd, args.reps)
    doc["models"] = _model_rounds(dist, gloo, args)
    if meter:
        doc["others"] = meter.stop()["others"]
    with open(os.path.join(args.out, "rank%d.json" % r), "w") as f:
        json.dump(doc, f)
    dist.destroy_process_group()


# ---- driver side ----


def _spread(values):
    return "%.2fx (%.2f-%.2f)" % (statistics.median(values), min(values), max(values))


def _allreduce_table(rows):
    lines = [
        "| size | gloo | hvdlite | gloo busbw | hvdlite busbw | gloo / hvdlite (median, range) | #wrong |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        n, size = row["n"], row["bytes"]
        med = {lib: statistics.median(t) for lib, t in row["times"].items()}
        bus = {lib: size / t * 2 * (n - 1) / n / 1e9 for lib, t in med.items()}
        lines.append(
            "| %s | %s | %s | %.2f GB/s | %.2f GB/s | %s | %d |"
            % (
                fmt_size(size),
                fmt_time(med["gloo"]),
                fmt_time(med["hvdlite"]),
                bus["gloo"],
                bus["hvdlite"],
                _spread(row["ratios"]),
                row["wrong"],
            )
        )
    return lines


def _model_table(models):
    t = models["times"]
    base = t["no communication"]
    lines = [
        "| step (%.1fM parameters) | median | / no communication | hvdlite / gloo |"
        % (models["params"] / 1e6)
    ]
    lines.append("|---|---|---|---|")
    for name, times in t.items():
        vs_gloo = ""
        if name.endswith("hvdlite"):
            vs_gloo = _spread([h / g for h, g in zip(times, t[name.replace("hvdlite", "gloo")])])
        lines.append(
            "| %s | %s | %s | %s |"
            % (
                name,
                fmt_time(statistics.median(times)),
                _spread([a / b for a, b in zip(times, base)]),
                vs_gloo,
            )
        )
    return lines


def report(doc, args):
    pc = doc["per_call"]
    cost = [(b - o) * 1e6 for b, o in zip(pc["backend"], pc["own"])]
    lines = [
        "# torch.distributed: the hvdlite backend beside gloo (%s, one job)"
        % (
            "%d simulated hosts, one rank each, links shaped to %s" % (args.hosts, args.rate)
            if args.hosts
            else "2 ranks, one host"
        ),
        "",
        host_line(),
        "- one compute thread per rank; others used %s of the machine during the run%s"
        % (
            fmt_others(doc.get("others")),
            " (above %.0f%%: re-run)" % (BUSY_LIMIT * 100) if (doc.get("others") or 0) > BUSY_LIMIT else "",
        ),
        "",
        "## all_reduce, float32, in place",
        "",
        *_allreduce_table(doc["allreduce"]),
        "",
        "## Per-call cost of the backend over hvdlite's own API (one float)",
        "",
        "dist.all_reduce %s, hvd.allreduce_ %s per call: the backend adds %.1f us (median; range %.1f-%.1f)"
        % (
            fmt_time(statistics.median(pc["backend"])),
            fmt_time(statistics.median(pc["own"])),
            statistics.median(cost),
            min(cost),
            max(cost),
        ),
        "",
        "## Whole-model steps (%d rounds of %d steps)" % (args.rounds, args.steps),
        "",
        *_model_table(doc["models"]),
        "",
    ]
    return "\n".join(lines)


def _worker_args(argv):
    """The driver's arguments the ranks need (not --quick, --hosts, --rate, --out-dir)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--hosts", "--rate", "--out-dir"):
            skip = True
        elif a != "--quick" and not a.startswith(("--hosts=", "--rate=", "--out-dir=")):
            out.append(a)
    return out


def _run_on_simhosts(args, worker_args):
    """One rank on each of args.hosts simulated hosts (tests/simhosts.py: network namespaces,
    sshd; needs root), every host link shaped to args.rate, started by hvdliterun -H."""
    import subprocess
    import tempfile

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from simhosts import SimCluster

    with tempfile.TemporaryDirectory() as tmp, SimCluster(tmp, args.hosts) as cluster:
        for h in cluster.hosts:
            tbf = ["tbf", "rate", args.rate, "burst", "1mb", "latency", "50ms"]
            subprocess.run(["tc", "qdisc", "add", "dev", h.veth_root, "root", *tbf], check=True)
            subprocess.run(
                ["ip", "netns", "exec", h.netns, "tc", "qdisc", "add", "dev", h.veth_host, "root", *tbf],
                check=True,
            )
        out = os.path.join(tmp, "out")
        os.makedirs(os.path.join(out, "gate"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_", "MASTER_"))}
        env.update(PYTHONPATH=os.path.dirname(HERE), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        cmd = [
            sys.executable,
            "-m",
            "hvdlite.runner.launch",
            "-np",
            str(args.hosts),
            "-H",
            cluster.hosts_arg(1),
        ]
        cmd += [sys.executable, SCRIPT, "--worker", "--out", out, *worker_args]
        res = subprocess.run(cmd, env=cluster.client_env(env), capture_output=True, text=True, timeout=1800)
        docs = []
        for r in range(args.hosts):
            path = os.path.join(out, "rank%d.json" % r)
            if os.path.exists(path):
                with open(path) as f:
                    docs.append(json.load(f))
        error = None if res.returncode == 0 else "exit %d: %s" % (res.returncode, res.stderr[-1500:])
        return docs, error


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4K,1M,64M")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--width", type=int, default=2500)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--idle-wait", type=float, default=30.0)
    p.add_argument("--quick", action="store_true", help="small sizes, few repetitions, a small model")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument(
        "--hosts", type=int, default=0, help="run on this many simulated hosts, one rank each (root)"
    )
    p.add_argument(
        "--rate", default="10gbit", help="with --hosts: every host link shaped to this rate (tc tbf)"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lib", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.reps, args.rounds, args.steps, args.width, args.idle_wait = (
            "4K,1M",
            3,
            2,
            2,
            256,
            1.0,
        )
    if args.worker:
        return worker(args)
    passed = _worker_args(argv if argv is not None else sys.argv[1:])
    extra = ["--quick"] if args.quick else []
    if args.hosts:
        docs, error = _run_on_simhosts(args, [*passed, *extra])
    else:
        docs, error = run_job("hvdlite", 2, SCRIPT, ["--worker", *passed, *extra], timeout_s=1800)
    if error or not docs:
        print("torch_backend: the job failed: %s" % error, file=sys.stderr)
        return 1
    text = report(docs[0], args)
    stem = "torch_backend" + ("_%dhosts" % args.hosts if args.hosts else "")
    write_outputs(args.out_dir, stem, text, data=docs[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
