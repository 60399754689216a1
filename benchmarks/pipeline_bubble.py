"""Pipeline bubble of hvd.parallel's schedules, measured: idle fraction per rank against the
textbook bubble, on 4 ranks:

    python benchmarks/pipeline_bubble.py [--quick] [--ranks 4]     # starts its own hvdliterun job
    python -m hvdlite.runner.launch -np 4 python benchmarks/pipeline_bubble.py [--png out.png]

Started by itself it launches the ranks through _launch.run_job and writes the table to
OUT/pipeline_bubble.md and the timelines to OUT/pipeline_bubble.png (OUT = --out-dir).

Compute is emulated with sleeps (forward F, input-gradient I and weight-gradient W, with
I = W = F, so B = 2F), so the ranks do not compete for cores and the measurement shows the
schedule and the stage-to-stage transfers, not the machine's load. An interleaved run gives
each of its v stages 1/v of the per-rank work, so every schedule does the same total work.
Idle fraction = 1 - (time in forward/backward actions) / (step time, first action of any
rank to last action of any rank); the bubble ratio is idle / busy, which the textbook gives
as (p-1)/m for 1F1B and (p-1)/(v*m) interleaved. The rest of the idle time is spent in the
stage-to-stage transfers (their mean time is printed: a send returns once posted, a receive
when its message is there). The ranks meet in a barrier between steps, so every step starts
together, as the textbook bubble assumes.
"""

import argparse
import os
import sys

import torch
from torch import nn

import hvdlite.torch as hvd
from hvdlite.parallel import schedules

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import add_driver_args, run_job
from _pipeline_model import hop_costs, replay
from _pipeline_sleep import Sleep
from _report import save_figure, write_outputs
from _worker import save_json

F_MS = 10.0


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
        a = Sleep.apply(x, self.ms / 2, self.ms)
        b = Sleep.apply(self.w * x.detach(), self.ms / 2, self.ms)
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
        # Every step starts together: sends are asynchronous, so a rank that ends its step early
        # (the last stage) would otherwise start the next one waiting for the first stage, and
        # that wait would count as idle time of the step it has not really started.
        hvd.barrier(process_set=ps)
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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--f-ms", type=float, default=F_MS, help="emulated forward time per rank")
    parser.add_argument("--png", default=None, help="write a timeline picture of the last steps")
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the job it starts itself")
    parser.add_argument("--lib", help="(set by the driver: run one rank)")
    parser.add_argument("--out", help="(set by the driver: where rank 0 writes its table)")
    add_driver_args(parser, quick="1 step, F = 5 ms")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.f_ms = 1, 5.0
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.lib or "HVDLITE_RANK" in os.environ:
        return run_rank(args)
    png = os.path.join(os.path.abspath(args.out_dir), "pipeline_bubble.png")
    os.makedirs(args.out_dir, exist_ok=True)
    passthrough = ["--microbatches=%d" % args.microbatches, "--steps=%d" % args.steps]
    passthrough += ["--f-ms=%s" % args.f_ms, "--png=" + png]
    docs, error = run_job("hvdlite", args.ranks, os.path.abspath(__file__), passthrough, timeout_s=600)
    if error or not docs:
        print("pipeline_bubble failed: %s" % (error or "no result"), flush=True)
        return 1
    text = "# Pipeline bubble of hvd.parallel's schedules\n\n" + docs[0]["text"]
    write_outputs(args.out_dir, "pipeline_bubble", text)
    return 0


def run_rank(args):
    """One rank: every schedule measured; rank 0 prints the table (and writes it to
    --out/rank0.json when the driver started the job)."""
    torch.set_num_threads(1)
    hvd.init()
    mesh = hvd.Mesh(pp=hvd.size())
    rows, timelines, models = [], {}, []
    for name in ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"):
        v, steps = measure(mesh, name, args.microbatches, args.steps, args.f_ms)
        everyone = hvd.allgather_object(steps, name="bubble." + name)
        idle, step_s = idle_fractions(everyone)
        rows.append((name, v, idle, step_s))
        timelines[name] = [tl[-1] for tl in everyone]
        if hvd.rank() == 0:  # only rank 0 prints: the replays run there alone
            models.append(transfer_model(name, v, hvd.size(), args, everyone, sum(idle) / len(idle)))
    if hvd.rank() == 0:
        text = "\n".join(
            table(rows, timelines, hvd.size(), args.microbatches, args.f_ms) + model_table(models)
        )
        print(text, flush=True)
        if args.out:
            save_json(os.path.join(args.out, "rank0.json"), {"rank": 0, "text": text})
        if args.png:
            _plot(timelines, args.png)
    hvd.shutdown()
    return 0


def table(rows, timelines, p, m, f_ms):
    """Markdown lines: a title line, then a row per schedule."""
    lines = [
        "pipeline bubble, %d ranks, %d microbatches, F=%.0f ms, B=2F (sleep-emulated)" % (p, m, f_ms),
        "",
        "| schedule | v | idle per rank | mean idle | bubble ratio | textbook (p-1)/(v*m) | step ms "
        "| ideal ms | transfers/rank | mean transfer ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ideal = (m + p - 1) * 3 * f_ms  # (m + p - 1) slots of F + B on the critical path
    for name, v, idle, step_s in rows:
        mean = sum(idle) / len(idle)
        xfers = [
            (e - s) * 1e3 for tl in timelines[name] for a, s, e in tl if a.kind.startswith(("SEND", "RECV"))
        ]
        lines.append(
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
    return lines


def transfer_model(name, v, p, args, per_rank_steps, measured_idle):
    """The schedule replayed at the transfer costs its timelines show (_pipeline_model), and
    the share of those costs the goal (idle within 10% of the free-transfer value) allows."""
    schedule = schedules.build(name.replace("Schedule", ""), p, v, args.microbatches)
    overrun, post, hop = hop_costs(per_rank_steps, args.f_ms, v)
    free = replay(schedule, args.f_ms, overrun)
    goal = 1.1 * free

    def at(share):
        return replay(schedule, args.f_ms, overrun, post * share, hop * share)

    lo, hi = 0.0, 1.0  # the largest share of (post, hop) whose replay meets the goal
    if at(hi) <= goal:
        lo = hi
    else:
        for _ in range(30):
            lo, hi = ((lo + hi) / 2, hi) if at((lo + hi) / 2) <= goal else (lo, (lo + hi) / 2)
    return name, overrun, post, hop, measured_idle, at(1.0), free, lo


def model_table(models):
    """Markdown lines: the transfer costs measured and the replay of each schedule."""
    lines = [
        "",
        "Transfer costs from the timelines (medians) and the schedule replayed with them "
        "(benchmarks/_pipeline_model.py); the goal is idle within 10% of the free-transfer "
        "value at the measured compute overrun:",
        "",
        "| schedule | compute overrun ms | post ms | hop ms (receiver waiting) | measured idle "
        "| replayed idle | free-transfer idle | goal | post + hop the goal allows ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, overrun, post, hop, measured, replayed, free, share in models:
        allows = "met" if share >= 1.0 else "%.3f" % ((post + hop) * share)
        lines.append(
            "| %s | %.2f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s |"
            % (name, overrun, post, hop, measured, replayed, free, 1.1 * free, allows)
        )
    return lines


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
    save_figure(fig, path, dpi=80)


if __name__ == "__main__":
    sys.exit(main())
