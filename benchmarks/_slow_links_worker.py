"""One rank of benchmarks/slow_links.py, started by hvdliterun -H on simulated hosts: trains
the model once per method, side by side in one job (the methods in turn, in the order given),
each from the same initial weights, and writes OUT/result.json (rank 0).

Per method: the training loop's wall time (a barrier before and after, the max over ranks),
the bytes that crossed the host links during it (each host's local rank 0 reads its network
namespace's /proc/net/dev, every interface but lo, transmit side: so ring and control traffic
both count, and nothing that stayed inside a host), rank 0's loss per step with its time, the
held-out accuracy and whether the replicas ended bit-identical. Methods:
  none, fp16, bf16, powersgd, topk, sign    hvd.DistributedOptimizer(compression=...)
  *-xhost, *-flat                           cross_host_only=True / False (default: None, which
                                            compresses the cross-host stage only where hosts
                                            run 2+ ranks each)
  diloco                                    hvd.DiLoCo(sync_every=8, outer_lr=0.7, outer_momentum=0.9)
  ddp, ddp-powersgd                         torch DDP on a gloo group, plain or with torch's
                                            PowerSGD hook (rank 4, start 10: the same settings)
One compute thread per rank (torch.set_num_threads(1)).
"""

import argparse
import hashlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _slow_links_models import Task, params

import hvdlite.torch as hvd

STATELESS = ("none", "fp16", "bf16")


def compressor(method):
    """The hvdlite compression of a method name (None for DiLoCo and the torch peers)."""
    base, _, variant = method.partition("-")
    cross = {"cross_host_only": {"xhost": True, "flat": False}[variant]} if variant else {}
    if base in STATELESS:
        return getattr(hvd.Compression, base)
    if base == "powersgd":
        return hvd.Compression.powersgd(rank=4, start_step=10, **cross)
    if base == "topk":
        return hvd.Compression.topk(ratio=0.01, **cross)
    if base == "sign":
        return hvd.Compression.sign(chunk=64, **cross)  # a scale per row: docs/compression.md
    return None


def link_tx_bytes():
    """Bytes this network namespace sent on every interface but lo."""
    total = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            if name.strip() != "lo":
                total += int(data.split()[8])
    return total


def digest(model):
    h = hashlib.sha256()
    for t in list(model.parameters()) + list(model.buffers()):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def build(method, model, lr, gloo):
    """(stepper, model to run forward on): stepper() is opt.step() (or nothing for DDP)."""
    inner = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if method == "diloco":
        return hvd.DiLoCo(model, inner, sync_every=8, outer_lr=0.7, outer_momentum=0.9), model
    if method.startswith("ddp"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        # One bucket (an explicit cap also caps the first bucket): torch's PowerSGD hook waits
        # on its second gloo allreduce inside a future's callback, which deadlocks on gloo once
        # two buckets' callbacks hold its threads (seen with torch 2.13: DDP's default 1 MiB
        # first bucket makes two).
        ddp = DistributedDataParallel(model, process_group=gloo, bucket_cap_mb=64)
        if method == "ddp-powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=gloo, matrix_approximation_rank=4, start_powerSGD_iter=10
            )
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return inner, ddp
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        inner, named_parameters=model.named_parameters(), compression=compressor(method)
    )
    return opt, model


def train(task, method, steps, lr, gloo):
    model = task.model()
    opt, forward = build(method, model, lr, gloo)
    local0 = hvd.local_rank() == 0
    hvd.barrier()
    tx0 = link_tx_bytes() if local0 else 0
    t0 = time.perf_counter()
    times, losses = [], []
    for step in range(steps):
        x, y = task.batch(step, hvd.rank())
        opt.zero_grad()
        loss = task.loss(forward(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    if method == "diloco" and steps % 8:
        opt.synchronize()
    hvd.barrier()
    wall = time.perf_counter() - t0
    sent = link_tx_bytes() - tx0 if local0 else 0
    walls = hvd.allgather_object(wall, name="wall." + method)
    link = sum(hvd.allgather_object(sent, name="tx." + method))
    same = len(set(hvd.allgather_object(digest(model), name="digest." + method))) == 1
    doc = {"method": method, "wall_s": max(walls), "link_bytes": link, "identical": same}
    doc.update(accuracy=task.accuracy(model), times=times, losses=losses)
    comp = getattr(opt, "_compression", None)
    if getattr(comp, "stateful", False):
        doc["submitted"] = hvd.allreduce(torch.tensor(float(comp.bytes_submitted)), op=hvd.Sum).item()
        doc["plans"] = {n: list(p) for n, p in comp.plans.items()}
    return doc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--methods", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--gloo", default="", help="addr:port of a gloo group for the ddp methods")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    gloo = None
    if args.gloo:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method="tcp://" + args.gloo, rank=hvd.rank(), world_size=hvd.size()
        )
        gloo = dist.group.WORLD
    task = Task(args.model, args.batch)
    methods = args.methods.split(",")
    runs = []
    for r in range(args.rounds):
        for method in methods if r % 2 == 0 else list(reversed(methods)):  # alternate the order
            doc = train(task, method, args.steps, args.lr, gloo)
            doc["round"] = r
            runs.append(doc)
            if hvd.rank() == 0:
                print(
                    "%s round %d: %.2f s, %.1f MB on the links, accuracy %.3f, identical %s"
                    % (method, r, doc["wall_s"], doc["link_bytes"] / 1e6, doc["accuracy"], doc["identical"]),
                    flush=True,
                )
    if hvd.rank() == 0:
        out = {"model": args.model, "params": params(task.model()), "ranks": hvd.size()}
        out.update(local_size=hvd.local_size(), steps=args.steps, batch=args.batch, runs=runs)
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(out, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
