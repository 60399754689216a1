"""One rank of e2e_torch.py: training steps of --model, timed.

    python _e2e_torch_worker.py --lib LIB --out DIR --mode MODE --model mlp|cnn --steps S --idle-wait W

LIB (hvdlite, gloo or horovod; see _launch.py) forms the job and gives the barrier; MODE says
how gradients are combined:
  alone  plain torch optimizer, no communication (the "single" and "nocomm" rows)
  train  the library's data parallelism: hvdlite.torch / horovod.torch DistributedOptimizer,
         torch DistributedDataParallel for gloo
  fp16   hvdlite.torch DistributedOptimizer with Compression.fp16
Every rank: one compute thread, WARMUP steps, a wait for an idle machine, then S steps, each
after a barrier (outside the timed region). Writes DIR/rank<r>.json: {"rank", "size",
"version", "params", "times" (seconds per step)}, rank 0's with "load" (see _machine.py).
Imports hvdlite only for LIB=hvdlite, so it runs in Horovod's venv too.
"""

import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from _machine import timed_steps  # noqa: E402
from _worker import run, step_doc  # noqa: E402
from digits_cnn import SmallCNN  # noqa: E402

BATCH = 32
WARMUP = 3


def make_model(name):
    """(model, one batch of inputs, targets): BATCH samples per rank."""
    torch.manual_seed(0)
    if name == "mlp":  # 64 -> 4096 -> 4096 -> 2048 -> 10: 25.4M parameters
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 4096),
            torch.nn.ReLU(),
            torch.nn.Linear(4096, 4096),
            torch.nn.ReLU(),
            torch.nn.Linear(4096, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 10),
        )
        return model, torch.randn(BATCH, 64), torch.randint(0, 10, (BATCH,))
    return SmallCNN(), torch.randn(BATCH, 1, 8, 8), torch.randint(0, 10, (BATCH,))


def distribute(lib, mode, model, opt):
    """(callable model, optimizer) for this library and mode."""
    if mode == "alone":
        return model, opt
    if lib == "gloo":
        return torch.nn.parallel.DistributedDataParallel(model), opt
    hvd = __import__("hvdlite.torch" if lib == "hvdlite" else "horovod.torch", fromlist=["init"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = hvd.Compression.fp16 if mode == "fp16" else hvd.Compression.none
    return model, hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), compression=compression
    )


def measure(comm, gate, args):
    """This rank's result document. The model (and DDP's hold on the process group) is freed
    when it returns, before the job is torn down."""
    model, x, y = make_model(args.model)
    forward, opt = distribute(args.lib, args.mode, model, torch.optim.SGD(model.parameters(), lr=0.01))

    def step():
        opt.zero_grad()
        F.cross_entropy(forward(x), y).backward()
        opt.step()

    times, load = timed_steps(comm, gate, step, args.steps, args.idle_wait, warmup=WARMUP)
    return step_doc(comm, times, load, params=sum(p.numel() for p in model.parameters()))


def main():
    run(measure, setup=lambda: torch.set_num_threads(1))


if __name__ == "__main__":
    sys.exit(main())
