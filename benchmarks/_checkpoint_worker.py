"""One rank of checkpoint_async.py: how long hvd.save_checkpoint stalls a ZeRO job of
zero_gpt.py's ~100M-parameter GPT, blocking and with blocking=False, and what the background
write costs the training steps that run meanwhile.

    python _checkpoint_worker.py --lib hvdlite --out DIR --idle-wait W --stage S --reps R \
        --steps K --dir CKPT_DIR [--tiny]

Per repetition, each part after a barrier: a blocking save (its time), K training steps with
no save pending (their times), an asynchronous save (its time: the stall), K steps while its
write runs (their times) and wait_checkpoint (its time). Writes DIR/rank<r>.json with those
lists and whether the write was still running after the K steps.
"""

import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _worker import run, step_doc  # noqa: E402
from _zero_gpt_worker import BATCH, CONTEXT, VOCAB, make_model  # noqa: E402


def add_args(p):
    p.add_argument("--stage", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--dir", required=True)
    p.add_argument("--tiny", action="store_true")


def _timed(comm, fn):
    comm.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(comm, gate, args):
    import hvdlite.torch as hvd
    from hvdlite.torch.parallel.zero import checkpoint_io

    model = make_model(args.tiny)
    params = sum(p.numel() for p in model.parameters())
    opt = hvd.ZeroOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4), model, stage=args.stage)
    gen = torch.Generator().manual_seed(comm.rank)
    x = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=gen)
    y = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=gen)

    def step():
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    path = os.path.join(args.dir, "ckpt")
    step()  # the optimizer state exists: the checkpoint has its full size
    hvd.save_checkpoint(path, model, opt)  # warm-up save
    gate.wait_idle(args.idle_wait)
    meter = gate.meter() if comm.rank == 0 else None
    if meter:
        meter.start()
    out = {k: [] for k in ("blocking", "plain_steps", "stall", "steps_during", "wait", "still_writing")}
    for _ in range(args.reps):
        out["blocking"].append(_timed(comm, lambda: hvd.save_checkpoint(path, model, opt)))
        out["plain_steps"].append([_timed(comm, step) for _ in range(args.steps)])
        out["stall"].append(_timed(comm, lambda: hvd.save_checkpoint(path, model, opt, blocking=False)))
        out["steps_during"].append([_timed(comm, step) for _ in range(args.steps)])
        job = checkpoint_io._PENDING
        out["still_writing"].append(bool(job is not None and job.thread.is_alive()))
        out["wait"].append(_timed(comm, hvd.wait_checkpoint))
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    return step_doc(comm, [], meter.stop() if meter else None, params=params, bytes=size, **out)


def main():
    run(measure, add=add_args, setup=lambda: torch.set_num_threads(1))


if __name__ == "__main__":
    sys.exit(main())
