"""hvdlite's CUDA path on one GPU, side by side with torch.distributed over NCCL in one run.

    python benchmarks/gpu_one_rank.py [--reps 200] [--out results/gpu_one_rank.md]

One process, world size 1, both libraries on the same GPU and the same tensors, measured in
alternating rounds. With one rank NCCL moves no data, so what this measures is each library's
own cost per collective on a GPU: submission, negotiation, fusion (hvdlite packs many small
tensors into one buffer with its batched kernel), stream ordering and completion.
  - 4 KiB allreduce, blocking, time per call (median);
  - 64 MiB allreduce, blocking;
  - ResNet-50's 161 gradients: every allreduce started asynchronously, then all waited for
    (hvdlite: allreduce_async_ + synchronize; torch: all_reduce(async_op=True) + wait).
It needs a CUDA GPU and hvdlite built with its NCCL module; it says so and exits 2 otherwise.
Nothing here asserts a speed.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _resnet50_shapes import resnet50_shapes


def _timed(fn, reps, sync):
    """Median seconds of fn() over reps calls, after a warm-up, each followed by sync()."""
    for _ in range(5):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cases(torch, hvd, dist, dev):
    small = torch.ones(1024, device=dev)
    large = torch.ones(16 << 20, device=dev)
    grads = [torch.ones(s, device=dev) for s in resnet50_shapes()]

    def hvd_resnet():
        handles = [hvd.allreduce_async_(g, name="g%d" % i, op=hvd.Sum) for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    def torch_resnet():
        for w in [dist.all_reduce(g, async_op=True) for g in grads]:
            w.wait()

    return [
        (
            "4 KiB allreduce",
            lambda: hvd.allreduce_(small, name="s", op=hvd.Sum),
            lambda: dist.all_reduce(small),
        ),
        (
            "64 MiB allreduce",
            lambda: hvd.allreduce_(large, name="l", op=hvd.Sum),
            lambda: dist.all_reduce(large),
        ),
        ("ResNet-50 161 gradients", hvd_resnet, torch_resnet),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="also write the Markdown table here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_one_rank: no CUDA GPU here (torch.cuda.is_available() is False)")
        return 2
    import torch.distributed as dist

    import hvdlite
    import hvdlite.torch as hvd

    if not hvdlite.nccl_built():
        print("gpu_one_rank: hvdlite was built without its NCCL module")
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    hvd.init()
    with tempfile.NamedTemporaryFile() as store:
        dist.init_process_group("nccl", init_method="file://" + store.name, rank=0, world_size=1)
        sync = torch.cuda.synchronize
        rows = {}
        for _ in range(args.rounds):
            for name, ours, theirs in _cases(torch, hvd, dist, dev):
                rows.setdefault(name, ([], []))
                rows[name][0].append(_timed(ours, args.reps, sync))
                rows[name][1].append(_timed(theirs, args.reps, sync))
        dist.destroy_process_group()
    hvd.shutdown()
    lines = [
        "GPU: %s; torch %s; NCCL %s (hvdlite's module: %d)"
        % (
            torch.cuda.get_device_name(dev),
            torch.__version__,
            torch.cuda.nccl.version(),
            hvdlite.nccl_built(),
        ),
        "",
        "| measure (1 rank) | hvdlite | torch.distributed NCCL | hvdlite / torch |",
        "|---|---|---|---|",
    ]
    for name, (ours, theirs) in rows.items():
        a, b = statistics.median(ours), statistics.median(theirs)
        lines.append("| %s | %.1f µs | %.1f µs | %.2f× |" % (name, a * 1e6, b * 1e6, a / b))
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
