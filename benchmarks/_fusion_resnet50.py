"""ResNet-50's 161 parameter tensors (25,557,032 float32) allreduced asynchronously in
reverse order, then synchronized: the fused-many-tensors case, through the full runtime.

    hvdliterun -np 2 .venv/bin/python benchmarks/_fusion_resnet50.py [--reps 15]

Prints the median and best time per step (max over ranks). Information only.
A helper (leading _, so `make bench` skips it): one rank of a job that hvdliterun starts,
not a self-launching side-by-side benchmark.
"""

import argparse
import time

import numpy as np
from _resnet50_shapes import SHAPES


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=15)
    a = p.parse_args()
    import hvdlite as hvd

    hvd.init()
    grads = [np.zeros(s, np.float32) for s in SHAPES]
    times = []
    for rep in range(a.reps + 2):
        hvd.allreduce_(np.zeros(1, np.float32), name="barrier")
        t0 = time.perf_counter()
        handles = [
            hvd.allreduce_async_(g, op=hvd.Average, name="g%d" % i)
            for i, g in reversed(list(enumerate(grads)))
        ]
        for h in handles:
            hvd.synchronize(h)
        dt = hvd.allreduce(np.array([time.perf_counter() - t0]), op=hvd.Max, name="tmax")[0]
        if rep >= 2:
            times.append(dt)
    times.sort()
    if hvd.rank() == 0:
        print(
            "resnet50 set (161 tensors, 97.5 MiB), %d ranks: median %.1f ms, best %.1f ms"
            % (hvd.size(), times[len(times) // 2] * 1e3, times[0] * 1e3)
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
