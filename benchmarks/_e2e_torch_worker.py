"""One rank of benchmarks/e2e_torch.py: trains --model for --steps timed steps in --mode and
writes {"rank", "params", "step_s": [seconds per step]} to --out/rank<r>.json.

Modes: single / nocomm (plain torch; RANK and WORLD_SIZE only name the output), hvdlite and
hvdlite-fp16 (hvdlite.torch.DistributedOptimizer, without / with fp16 compression), ddp (DistributedDataParallel over gloo, env://),
horovod (horovod.torch.DistributedOptimizer). One compute thread; a barrier before each
timed step in the modes that communicate.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from pytorch_digits import SmallCNN  # noqa: E402

BATCH = 32
WARMUP = 3


def make_model(name):
    """(model, input batch, targets) with BATCH samples."""
    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(64, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                                    torch.nn.ReLU(), torch.nn.Linear(4096, 2048), torch.nn.ReLU(),
                                    torch.nn.Linear(2048, 10))
        return model, torch.randn(BATCH, 64), torch.randint(0, 10, (BATCH,))
    return SmallCNN(), torch.randn(BATCH, 1, 8, 8), torch.randint(0, 10, (BATCH,))


def setup(mode, model, opt):
    """(rank, optimizer or DDP-wrapped pieces, barrier callable, model to call)."""
    if mode in ("single", "nocomm"):
        return int(os.environ["RANK"]), opt, (lambda: None), model
    if mode == "ddp":
        import datetime
        import torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        return dist.get_rank(), opt, dist.barrier, torch.nn.parallel.DistributedDataParallel(model)
    hvd = __import__("horovod.torch" if mode == "horovod" else "hvdlite.torch", fromlist=["init"])
    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = hvd.Compression.fp16 if mode.endswith("fp16") else hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression)
    return hvd.rank(), opt, hvd.barrier if hasattr(hvd, "barrier") else (lambda: hvd.allreduce(torch.zeros(1))), model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, x, y = make_model(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rank, opt, barrier, forward = setup(args.mode, model, opt)
    times = []
    for step in range(WARMUP + args.steps):
        barrier()
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(forward(x), y).backward()
        opt.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    with open(os.path.join(args.out, "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "params": sum(p.numel() for p in model.parameters()), "step_s": times}, f)
    if args.mode == "ddp":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
