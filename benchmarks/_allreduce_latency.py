"""Small-message allreduce latency through the full runtime (negotiation included).

    hvdliterun -np 2 .venv/bin/python benchmarks/_allreduce_latency.py [--bytes 4096] [--calls 1000] [--reps 7]

Each repetition: a barrier-like allreduce, then `calls` back-to-back in-place
allreduce_ calls of a float32 array of `bytes` bytes (kept at zero); the time per
call is the max over ranks. Prints the median and min over repetitions, and how
busy the machine was meanwhile (CPU time used by processes other than the ranks,
in cores: _machine.LoadMeter, /proc/stat minus the ranks' own CPU time). Information only.
A helper (leading _, so `make bench` skips it): one rank of a job that hvdliterun starts,
not a self-launching side-by-side benchmark.
"""

import argparse
import os
import time

import numpy as np
from _machine import LoadMeter


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    import hvdlite as hvd

    hvd.init()
    buf = np.zeros(a.bytes // 4, np.float32)
    for _ in range(200):
        hvd.allreduce_(buf, op=hvd.Sum, name="lat")
    times = []
    meter = LoadMeter(hvd.allgather(np.array([os.getpid()]), name="pids").tolist())
    meter.start()
    for _ in range(a.reps):
        hvd.allreduce_(np.zeros(1, np.float32), op=hvd.Sum, name="sync")
        t0 = time.perf_counter()
        for _ in range(a.calls):
            hvd.allreduce_(buf, op=hvd.Sum, name="lat")
        dt = (time.perf_counter() - t0) / a.calls
        times.append(hvd.allreduce(np.array([dt]), op=hvd.Max, name="t")[0])
    load = meter.stop()
    if hvd.rank() == 0:
        times.sort()
        print(
            "allreduce_ %d B x %d calls, %d ranks: median %.1f us, min %.1f us; "
            "ranks used %.2f cores, others %.2f cores"
            % (
                a.bytes,
                a.calls,
                hvd.size(),
                times[len(times) // 2] * 1e6,
                times[0] * 1e6,
                load["ranks_cpu_s"] / load["wall_s"],
                load["others_cpu_s"] / load["wall_s"],
            )
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
