"""Pipeline bubble of hvd.parallel's schedules, measured: idle fraction per rank against the
textbook bubble. Run on 4 ranks:

    python -m hvdlite.runner.launch -np 4 python benchmarks/pipeline_bubble.py [--png out.png]

Compute is emulated with sleeps (forward F, input-gradient I and weight-gradient W, with
I = W = F, so B = 2F), so the ranks do not compete for cores and the measurement shows the
schedule and the stage-to-stage transfers, not the machine's load. An interleaved run gives
each of its v stages 1/v of the per-rank work, so every schedule does the same total work.
Idle fraction = 1 - (time in forward/backward actions) / (step time, first action of any
rank to last action of any rank); the bubble ratio is idle / busy, which the textbook gives
as (p-1)/m for 1F1B and (p-1)/(v*m) interleaved. The rest of the idle time is spent in the
blocking stage-to-stage transfers (their mean time is printed).
"""

import argparse
import time

import torch
from torch import nn

import hvdlite.torch as hvd

F_MS = 10.0


class _Sleep(torch.autograd.Function):
    """Identity that sleeps fwd_ms forward and bwd_ms backward."""

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
    """out = slow_input_path(x) + slow_weight_path(w, x.detach()): the input gradient and the
    weight gradient take separate, equally long backward paths, as a zero-bubble split needs."""

    def __init__(self, f_ms):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.ms = f_ms

    def forward(self, x):
        if not x.requires_grad:  # the first stage: give it the same backward work as the others
            x = x.detach().requires_grad_()
        a = _Sleep.apply(x, self.ms / 2, self.ms)
        b = _Sleep.apply(self.w * x.detach(), self.ms / 2, self.ms)
        return a + b


def measure(mesh, name, m, steps, f_ms):
    P, ps = hvd.parallel, mesh.process_set("pp")
    p = ps.size()
    v = 2 if "Interleaved" in name else 1
    stages = [
        P.PipelineStage(SleepStage(f_ms / v), s, p * v, process_set=ps) for s in range(ps.rank(), p * v, p)
    ]
    sched = getattr(P, name)(
        stages if v > 1 else stages[0], m, loss_fn=lambda out, y: (out - y).pow(2).mean()
    )
    x, y = torch.randn(m * 2, 4), torch.randn(m * 2, 4)
    timelines = []
    for i in range(steps + 1):
        sched.step(x, target=y)
        if i:  # the first step negotiates every transfer's name: not counted
            timelines.append(sched.last_timeline)
    return v, timelines


def idle_fractions(per_rank_steps):
    """Per rank, the share of the steps' wall time (first action of any rank to last action of
    any rank, per step) outside forward/backward compute; and the mean step time."""
    n_steps = len(per_rank_steps[0])
    idle, spans = [0.0] * len(per_rank_steps), []
    for k in range(n_steps):
        start = min(tl[k][0][1] for tl in per_rank_steps)
        end = max(tl[k][-1][2] for tl in per_rank_steps)
        spans.append(end - start)
        for r, tl in enumerate(per_rank_steps):
            busy = sum(e - s for a, s, e in tl[k] if a.kind in ("F", "B", "I", "W"))
            idle[r] += (1 - busy / (end - start)) / n_steps
    return idle, sum(spans) / n_steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--f-ms", type=float, default=F_MS, help="emulated forward time per rank")
    parser.add_argument("--png", default=None, help="write a timeline picture of the last steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    mesh = hvd.Mesh(pp=hvd.size())
    p, m = hvd.size(), args.microbatches
    rows, timelines = [], {}
    for name in ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"):
        v, steps = measure(mesh, name, m, args.steps, args.f_ms)
        everyone = hvd.allgather_object(steps, name="bubble." + name)
        idle, step_s = idle_fractions(everyone)
        rows.append((name, v, idle, step_s))
        timelines[name] = [tl[-1] for tl in everyone]
    if hvd.rank() == 0:
        print(
            "pipeline bubble, %d ranks, %d microbatches, F=%.0f ms, B=2F (sleep-emulated)" % (p, m, args.f_ms)
        )
        print(
            "| schedule | v | idle per rank | mean idle | bubble ratio | textbook (p-1)/(v*m) | step ms | ideal ms | transfers/rank | mean transfer ms |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        f_ms = args.f_ms
        ideal = (m + p - 1) * 3 * f_ms  # (m + p - 1) slots of F + B on the critical path
        for name, v, idle, step_s in rows:
            mean = sum(idle) / len(idle)
            xfers = [
                (e - s) * 1e3
                for tl in timelines[name]
                for a, s, e in tl
                if a.kind.startswith(("SEND", "RECV"))
            ]
            print(
                "| %s | %d | %s | %.3f | %.3f | %.3f | %.0f | %.0f | %d | %.1f |"
                % (
                    name,
                    v,
                    " ".join("%.3f" % f for f in idle),
                    mean,
                    mean / (1 - mean),
                    (p - 1) / (v * m),
                    step_s * 1e3,
                    ideal if v == 1 else (v * m + p - 1) * 3 * f_ms / v,
                    len(xfers) // p,
                    sum(xfers) / max(1, len(xfers)),
                )
            )
        if args.png:
            _plot(timelines, args.png)
    hvd.shutdown()


def _plot(timelines, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"F": "tab:blue", "B": "tab:red", "I": "tab:orange", "W": "tab:green"}
    fig, axes = plt.subplots(len(timelines), 1, figsize=(12, 2.2 * len(timelines)))
    for ax, (name, per_rank) in zip(axes, timelines.items()):
        t0 = min(tl[0][1] for tl in per_rank)
        for r, tl in enumerate(per_rank):
            for action, start, end in tl:
                if action.kind in colors:
                    ax.barh(
                        r,
                        (end - start) * 1e3,
                        left=(start - t0) * 1e3,
                        color=colors[action.kind],
                        edgecolor="k",
                    )
        ax.set_title(name)
        ax.set_yticks(range(len(per_rank)))
        ax.set_ylabel("rank")
        ax.invert_yaxis()
    axes[-1].set_xlabel("ms (F blue, B red, I orange, W green)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    main()
