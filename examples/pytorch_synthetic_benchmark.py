"""Synthetic PyTorch benchmark with hvdlite, after Horovod's pytorch_synthetic_benchmark.py.

    hvdliterun -np 2 python examples/pytorch_synthetic_benchmark.py [--model mlp|cnn]

Trains on random data (no input pipeline) with hvd.DistributedOptimizer and reports
images/second per rank and in total, as the mean and a 95% interval over the timed
iterations. The defaults are small so it runs in seconds on a CPU with one thread per rank;
--model cnn --image-size 32 --batch-size 32 makes it heavier.
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import hvdlite.torch as hvd


def make_model(name, image_size, classes):
    if name == "mlp":
        return torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(3 * image_size * image_size, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, classes),
        )
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * (image_size // 4) ** 2, classes),
    )


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "cnn"], default="cnn")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    parser.add_argument("--use-adasum", action="store_true")
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    return parser.parse_args()


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = make_model(args.model, args.image_size, args.num_classes)
    scale = 1 if args.use_adasum else hvd.size()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * scale)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))

    def benchmark_step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    log(
        "Model: %s, batch size %d per rank, %d ranks, %d parameters"
        % (args.model, args.batch_size, hvd.size(), sum(p.numel() for p in model.parameters()))
    )
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log("Iter #%d: %.1f img/sec per rank" % (i, rate))
        rates.append(rate)
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log("Img/sec per rank: %.1f +-%.1f" % (mean, conf))
    log("Total img/sec on %d rank(s): %.1f +-%.1f" % (hvd.size(), hvd.size() * mean, hvd.size() * conf))
    hvd.shutdown()


if __name__ == "__main__":
    main()
