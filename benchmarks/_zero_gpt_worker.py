"""One rank of zero_gpt.py: AdamW training steps of a ~100M-parameter GPT, timed, with the
rank's peak RSS over the timed steps.

    python _zero_gpt_worker.py --lib LIB --out DIR --mode MODE --steps S --idle-wait W

MODE (LIB): ddp (hvdlite: DistributedOptimizer), zero1 / zero2 / zero3 (hvdlite:
ZeroOptimizer), zero3-commit (zero3 with hvd.elastic.TorchState(model, opt).commit() after every
step: buddy copies of the shards, mapped from the owner's /dev/shm file on one host, else
exchanged while the next step runs; the commit's own time,
the training thread's stall, is recorded as "commit_times"), zero3-commit-sync (the same with
buddy_overlap=False: each commit waits for its exchange), fsdp2 / fsdp2-keep (gloo: torch fully_shard per block and root, reshard after
forward True / False), torch-zero (gloo: DistributedDataParallel + ZeroRedundancyOptimizer),
ds1 / ds2 / ds3 (gloo job, DeepSpeed ZeRO stage n, fp32, DS_ACCELERATOR=cpu).
Peak RSS: the kernel's high-water mark (VmHWM), reset after the warm-up steps
(/proc/self/clear_refs), read after the timed ones. Writes DIR/rank<r>.json: {"rank", "size",
"version", "params", "times", "peak_rss", "rss_before"}, rank 0's with "load".
"""

import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from _machine import timed_steps  # noqa: E402
from _worker import run, step_doc  # noqa: E402
from pytorch_zero_gpt import GPT  # noqa: E402

BATCH, CONTEXT, VOCAB = 4, 64, 16384
WIDTH, LAYERS, HEADS = 768, 12, 12
WARMUP = 1


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def make_model(tiny):
    torch.manual_seed(0)
    if tiny:  # a smoke run of the rows (zero_gpt.py --tiny)
        return GPT(vocab=VOCAB, d=64, layers=2, heads=4, context=CONTEXT)
    return GPT(vocab=VOCAB, d=WIDTH, layers=LAYERS, heads=HEADS, context=CONTEXT)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)


def distribute(lib, mode, model):
    """(callable model, optimizer, step hook or None) for this mode."""
    if lib == "hvdlite":
        import hvdlite.torch as hvd

        if mode == "ddp":
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            return model, hvd.DistributedOptimizer(
                _adamw(model.parameters()), named_parameters=model.named_parameters()
            )
        stage = int(mode[len("zero")])
        return model, hvd.ZeroOptimizer(_adamw(model.parameters()), model, stage=stage)
    if mode.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, reshard_after_forward=mode == "fsdp2")
        fully_shard(model, reshard_after_forward=mode == "fsdp2")
        return model, _adamw(model.parameters())
    if mode == "torch-zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        ddp = torch.nn.parallel.DistributedDataParallel(model)
        return ddp, ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4, weight_decay=0.01
        )
    import deepspeed  # mode ds1 / ds2 / ds3

    os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))  # one host; DeepSpeed asks

    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "zero_optimization": {"stage": int(mode[-1])},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
    }
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine, opt


def measure(comm, gate, args):
    model = make_model(args.tiny)
    params = sum(p.numel() for p in model.parameters())
    forward, opt = distribute(args.lib, args.mode, model)
    gen = torch.Generator().manual_seed(comm.rank)
    x = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=gen)
    y = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=gen)
    deepspeed_engine = args.mode.startswith("ds")
    commit, commit_times = None, []
    if "-commit" in args.mode:
        import time

        import hvdlite.torch as hvd

        state = hvd.elastic.TorchState(model, opt, buddy_overlap=not args.mode.endswith("-sync"))

        def commit():
            t0 = time.perf_counter()
            state.commit()
            commit_times.append(time.perf_counter() - t0)

    def step():
        loss = F.cross_entropy(forward(x).flatten(0, 1), y.flatten())
        if deepspeed_engine:
            forward.backward(loss)
            forward.step()
            return
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if commit is not None:
            commit()

    for _ in range(WARMUP):
        comm.barrier()
        step()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    rss_before = _status_kib("VmRSS")
    times, load = timed_steps(comm, gate, step, args.steps, args.idle_wait, warmup=0)
    if deepspeed_engine:
        import deepspeed

        comm.version += "; deepspeed " + deepspeed.__version__
    peak = _status_kib("VmHWM")
    extra = {"commit_times": commit_times[-args.steps :]} if commit_times else {}
    return step_doc(comm, times, load, params=params, peak_rss=peak, rss_before=rss_before, **extra)


def main():
    run(measure, setup=lambda: torch.set_num_threads(1))


if __name__ == "__main__":
    sys.exit(main())
