"""Allreduce busbw through the full runtime (processes, negotiation included).

    hvdliterun -np N .venv/bin/python benchmarks/_allreduce_busbw.py [--sizes 1M,16M,64M,256M]

float32 Sum, in place (allreduce_), buffers touched first and kept at zero while timed.
Per size: a correctness pass with rank-dependent data (#wrong), warm-up, then repetitions;
each repetition starts after a small allreduce (a barrier) and its time is the max over
ranks; prints the median and best busbw (nccl-tests: algbw * 2(n-1)/n) and how many cores
processes other than the ranks used meanwhile ("others"). Information only.
--floor adds what no in-place allreduce can beat on this machine: every rank reading and
writing its own buffer once (buf *= 1, in place), timed the same way while all ranks do it at
once ("floor_us"), and the allreduce's median over it ("x_floor"). On a 2-rank host the ranks
then share the memory bus as they do in the allreduce.
A helper (leading _, so `make bench` skips it): one rank of a job that hvdliterun starts,
not a self-launching side-by-side benchmark.
"""

import argparse
import os
import time

import numpy as np
from _machine import LoadMeter
from collectives import parse_size


def timed(hvd, reps, calls, work):
    """Sorted seconds per call of `work` over `reps` repetitions, each started after a small
    allreduce (a barrier) and counted on the slowest rank."""
    times = []
    for _ in range(reps):
        hvd.allreduce_(np.zeros(1, np.float32), op=hvd.Sum, name="barrier")
        t0 = time.perf_counter()
        for _ in range(calls):
            work()
        dt = (time.perf_counter() - t0) / calls
        times.append(hvd.allreduce(np.array([dt]), op=hvd.Max, name="tmax")[0])
    return sorted(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="4K,1M,16M,64M,256M")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--floor", action="store_true", help="also time an in-place pass over each buffer")
    a = p.parse_args()
    import hvdlite as hvd

    hvd.init()
    n, r = hvd.size(), hvd.rank()
    meter = LoadMeter(hvd.allgather(np.array([os.getpid()]), name="pids").tolist())
    rows = []
    for size in [parse_size(s) for s in a.sizes.split(",")]:
        count = size // 4
        buf = np.full(count, float(r + 1), np.float32)
        hvd.allreduce_(buf, op=hvd.Sum, name="check")
        wrong = int(np.count_nonzero(buf != n * (n + 1) / 2))
        buf[:] = 0
        calls = max(1, min(1000, (1 << 22) // max(size, 1)))
        for _ in range(2):
            hvd.allreduce_(buf, op=hvd.Sum, name="t")
        meter.start()
        times = timed(hvd, a.reps, calls, lambda b=buf: hvd.allreduce_(b, op=hvd.Sum, name="t"))
        load = meter.stop()
        floor = timed(hvd, a.reps, calls, lambda b=buf: np.multiply(b, 1.0, out=b)) if a.floor else None
        floor_median = floor[len(floor) // 2] if floor else None
        others = load["others_cpu_s"] / load["wall_s"]  # in cores
        factor = 2.0 * (n - 1) / n
        rows.append((size, times[len(times) // 2], times[0], wrong, factor, others, floor_median))
    if r == 0:
        print("allreduce float32 sum through the runtime, %d ranks (in place)" % n)
        head = ("bytes", "median_us", "min_us", "busbw_GB/s", "best_busbw", "#wrong", "others")
        print(
            "%12s %12s %12s %12s %12s %7s %7s" % head
            + (" %12s %8s" % ("floor_us", "x_floor") if a.floor else "")
        )
        for size, med, best, wrong, factor, others, floor in rows:
            line = "%12d %12.1f %12.1f %12.3f %12.3f %7d %7.2f" % (
                size,
                med * 1e6,
                best * 1e6,
                size / med * factor / 1e9,
                size / best * factor / 1e9,
                wrong,
                others,
            )
            if floor:
                line += " %12.1f %8.2f" % (floor * 1e6, med / floor)
            print(line)
    hvd.shutdown()


if __name__ == "__main__":
    main()
