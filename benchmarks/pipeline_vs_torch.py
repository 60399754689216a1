"""Step time of one pipeline schedule through hvd.parallel and through
torch.distributed.pipelining (gloo), same model, same ranks, side by side:

    python benchmarks/pipeline_vs_torch.py [--ranks 4] [--schedule Schedule1F1B] [--steps 5]

Two models per stage: "sleep" (compute emulated by sleeps, F = --f-ms, B = 2F: shows the
schedule and the transfers, not the machine's load) and "mlp" (a real 2-layer MLP of width
--width on a batch of --batch rows: transfers of real activations, real compute). The first
step of each is not timed (shape inference, negotiation). Both jobs start through _launch.run_job
(this script, with --lib, is their rank), --rounds times alternating (hvdlite, torch, hvdlite,
...), so drift in the machine's load reaches both. Prints a markdown table and writes it to
OUT/pipeline_vs_torch.md: each library's median step time over the rounds, and the ratio,
torch's step time over hvdlite's in the same round (above 1: hvdlite faster), as the median
and range over the rounds.
"""

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import add_driver_args, available, host_line, run_job
from _pipeline_sleep import Sleep
from _report import write_outputs
from _worker import save_json

SCRIPT = os.path.abspath(__file__)


class SleepStage(nn.Module):
    def __init__(self, width, f_ms):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.f_ms = f_ms

    def forward(self, x):
        return Sleep.apply(x * self.w, self.f_ms, 2 * self.f_ms)


class MlpStage(nn.Module):
    def __init__(self, width, f_ms):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))

    def forward(self, x):
        return x + self.net(x)


def _loss(out, target):
    return (out - target).pow(2).mean()


def _time_steps(step, steps):
    step()  # shape inference / first negotiation: not timed
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


def worker_hvdlite(args):
    import hvdlite.torch as hvd

    hvd.init()
    mesh = hvd.Mesh(pp=hvd.size())
    ps, me, n = mesh.process_set("pp"), hvd.rank(), hvd.size()
    out = {}
    for kind, cls in (("sleep", SleepStage), ("mlp", MlpStage)):
        torch.manual_seed(me)
        stage = hvd.parallel.PipelineStage(cls(args.width, args.f_ms), me, n, process_set=ps)
        sched = getattr(hvd.parallel, args.schedule)(stage, args.microbatches, loss_fn=_loss)
        x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)
        out[kind] = _time_steps(lambda sched=sched, x=x, y=y: sched.step(x, target=y), args.steps)
    return out


def worker_torch(args):
    import torch.distributed as dist
    from torch.distributed import pipelining

    # _launch's gloo launcher: RANK, WORLD_SIZE and a tcp:// init method
    me, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ["BENCH_GLOO_INIT"], rank=me, world_size=n)
    out = {}
    for kind, cls in (("sleep", SleepStage), ("mlp", MlpStage)):
        torch.manual_seed(me)
        stage = pipelining.PipelineStage(cls(args.width, args.f_ms), me, n, device=torch.device("cpu"))
        sched = getattr(pipelining, args.schedule)(stage, args.microbatches, loss_fn=_loss)
        x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)

        def step(sched=sched, x=x, y=y):
            if me == 0:
                sched.step(x)
            elif me == n - 1:
                sched.step(target=y)
            else:
                sched.step()

        out[kind] = _time_steps(step, args.steps)
    dist.destroy_process_group()
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", choices=("hvdlite", "gloo"), help="(set by the driver: run one rank)")
    parser.add_argument("--out", help="(set by the driver: where a rank writes its result)")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--schedule", default="Schedule1F1B")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--f-ms", type=float, default=10.0)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    add_driver_args(parser, quick="2 steps, F = 5 ms, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.f_ms, args.rounds = 2, 5.0, 1
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.lib:  # one rank of a job the driver started
        out = (worker_hvdlite if args.lib == "hvdlite" else worker_torch)(args)
        if _rank() == 0:  # every rank timed the same steps; rank 0's times are the table's
            save_json(os.path.join(args.out, "rank0.json"), dict(out, rank=0))
        return 0
    passthrough = [
        "--%s=%s" % (k, getattr(args, k.replace("-", "_")))
        for k in ("ranks", "schedule", "microbatches", "steps", "f-ms", "width", "batch")
    ]
    libs, skipped = available(["hvdlite", "gloo"])
    rounds = {lib: [] for lib in libs}
    for _ in range(args.rounds):
        for lib in libs:
            docs, error = run_job(lib, args.ranks, SCRIPT, passthrough, timeout_s=600)
            if error or not docs:
                skipped[lib] = "job failed: %s" % (error or "no result")
            else:
                rounds[lib].append(docs[0])
    lines = [
        "# Pipeline step time: hvd.parallel against torch.distributed.pipelining (gloo)",
        "",
        host_line(),
        "- %s, %d ranks, %d microbatches, batch %d, width %d, sleep F=%.0f ms, %d timed steps"
        % (args.schedule, args.ranks, args.microbatches, args.batch, args.width, args.f_ms, args.steps),
        "- %d alternating rounds; step times are medians over the rounds, the ratio is per round "
        "(median and range)" % args.rounds,
    ]
    lines += ["- **%s skipped**: %s" % (k, v) for k, v in skipped.items()]
    lines += [
        "",
        "| model | hvdlite ms/step | torch.distributed.pipelining (gloo) ms/step | torch / hvdlite (range) |",
        "|---|---|---|---|",
    ]
    hv, tv = rounds.get("hvdlite", []), rounds.get("gloo", [])
    for kind in ("sleep", "mlp"):
        h, t = [d[kind] for d in hv if kind in d], [d[kind] for d in tv if kind in d]
        cells = ["%.1f" % (statistics.median(v) * 1e3) if v else "n/a" for v in (h, t)]
        ratios = [b / a for a, b in zip(h, t)]
        ratio = "%.2f× (%.2f-%.2f)" % (statistics.median(ratios), min(ratios), max(ratios)) if ratios else ""
        lines.append("| %s | %s | %s | %s |" % (kind, cells[0], cells[1], ratio))
    lines += _sleep_idle_lines(args, hv, tv)
    write_outputs(args.out_dir, "pipeline_vs_torch", "\n".join(lines), {"hvdlite": hv, "gloo": tv})
    return 0 if hv and tv else 1


def _sleep_idle_lines(args, hv, tv):
    """The sleep model's idle fraction per library: every rank sleeps m (F + B) per step (B = 2F),
    so idle = 1 - 3 m F / step (the free-transfer value of 1F1B at p=4, m=8 is 0.273)."""
    busy_s = 3 * args.microbatches * args.f_ms / 1e3
    cells = []
    for name, docs in (("hvdlite", hv), ("torch.distributed.pipelining", tv)):
        steps = [d["sleep"] for d in docs if "sleep" in d]
        if steps:
            idle = [1 - busy_s / t for t in steps]
            cells.append("%s %.3f (%.3f-%.3f)" % (name, statistics.median(idle), min(idle), max(idle)))
    if not cells:
        return []
    return [
        "",
        "Sleep model, idle fraction of a rank (1 - m(F+B) / step; median and range over the rounds): "
        + "; ".join(cells)
        + ".",
    ]


def _rank():
    """This rank's number, from its launcher (_launch: hvdliterun or the gloo launcher)."""
    return int(os.environ.get("HVDLITE_RANK", os.environ.get("RANK", "0")))


if __name__ == "__main__":
    sys.exit(main())
