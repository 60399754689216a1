"""Step time of one pipeline schedule through hvd.parallel and through
torch.distributed.pipelining (gloo), same model, same ranks, side by side:

    python benchmarks/pipeline_vs_torch.py [--ranks 4] [--schedule Schedule1F1B] [--steps 5]

Two models per stage: "sleep" (compute emulated by sleeps, F = --f-ms, B = 2F: shows the
schedule and the transfers, not the machine's load) and "mlp" (a real 2-layer MLP of width
--width on a batch of --batch rows: transfers of real activations, real compute). The first
step of each is not timed (shape inference, negotiation). Prints a markdown table; the
ratio is torch's step time over hvdlite's (above 1: hvdlite faster).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch
from torch import nn

HERE = os.path.abspath(__file__)


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd_ms, bwd_ms):
        ctx.bwd_ms = bwd_ms
        time.sleep(fwd_ms / 1000)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd_ms / 1000)
        return grad, None, None


class SleepStage(nn.Module):
    def __init__(self, width, f_ms):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.f_ms = f_ms

    def forward(self, x):
        return _Sleep.apply(x * self.w, self.f_ms, 2 * self.f_ms)


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

    dist.init_process_group("gloo")
    me, n = dist.get_rank(), dist.get_world_size()
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


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(lib, args, passthrough):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, HERE, "--worker", lib] + passthrough
    if lib == "hvdlite":
        res = subprocess.run(
            [sys.executable, "-m", "hvdlite.runner.launch", "-np", str(args.ranks)] + cmd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        outs = [res.stdout]
    else:
        port = _free_port()
        procs = [
            subprocess.Popen(
                cmd,
                env=dict(
                    env,
                    RANK=str(r),
                    WORLD_SIZE=str(args.ranks),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(args.ranks)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
    for text in outs:
        for line in text.splitlines():
            if "RESULT " in line:
                return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError("%s run produced no result:\n%s" % (lib, "\n".join(outs)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=("hvdlite", "torch"))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--schedule", default="Schedule1F1B")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--f-ms", type=float, default=10.0)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.worker:
        out = (worker_hvdlite if args.worker == "hvdlite" else worker_torch)(args)
        print("RESULT " + json.dumps(out), flush=True)
        return
    passthrough = [a for a in sys.argv[1:]]
    hv, tv = _run("hvdlite", args, passthrough), _run("torch", args, passthrough)
    print(
        "%s, %d ranks, %d microbatches, batch %d, width %d, sleep F=%.0f ms"
        % (args.schedule, args.ranks, args.microbatches, args.batch, args.width, args.f_ms)
    )
    print("| model | hvdlite ms/step | torch.distributed.pipelining (gloo) ms/step | torch / hvdlite |")
    print("|---|---|---|---|")
    for kind in ("sleep", "mlp"):
        print("| %s | %.1f | %.1f | %.2f |" % (kind, hv[kind] * 1e3, tv[kind] * 1e3, tv[kind] / hv[kind]))


if __name__ == "__main__":
    main()
