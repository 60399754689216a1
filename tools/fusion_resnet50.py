"""ResNet-50's 161 parameter tensors (25,557,032 float32) allreduced asynchronously in
reverse order, then synchronized: the fused-many-tensors case, through the full runtime.

    hvdliterun -np 2 .venv/bin/python tools/fusion_resnet50.py [--reps 15]

Prints the median and best time per step (max over ranks). Information only.
"""

import argparse
import time

import numpy as np


def resnet50_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [
                (width, inplanes, 1, 1),
                (width,),
                (width,),
                (width, width, 3, 3),
                (width,),
                (width,),
                (4 * width, width, 1, 1),
                (4 * width,),
                (4 * width,),
            ]
            if b == 0:
                shapes += [(4 * width, inplanes, 1, 1), (4 * width,), (4 * width,)]
            inplanes = 4 * width
    return shapes + [(1000, 2048), (1000,)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=15)
    a = p.parse_args()
    import hvdlite as hvd

    hvd.init()
    shapes = resnet50_shapes()
    assert len(shapes) == 161 and sum(int(np.prod(s)) for s in shapes) == 25557032
    grads = [np.zeros(s, np.float32) for s in shapes]
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
