"""Small-message allreduce latency through the full runtime (negotiation included).

    hvdliterun -np 2 .venv/bin/python benchmarks/_allreduce_latency.py [--bytes 4096] [--calls 1000] [--reps 7]

Each repetition: a barrier-like allreduce, then `calls` back-to-back in-place
allreduce_ calls of a float32 array of `bytes` bytes (kept at zero); the time per
call is the max over ranks. Prints the median and min over repetitions, and how
busy the machine was meanwhile (CPU time used by processes other than the ranks,
in cores, from /proc/stat minus the ranks' own rusage). Information only.
A helper (leading _, so `make bench` skips it): one rank of a job that hvdliterun starts,
not a self-launching side-by-side benchmark.
"""

import argparse
import resource
import time

import numpy as np


def cpu_jiffies():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, sum(fields[:8])


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
    busy0, _total0 = cpu_jiffies()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    for _ in range(a.reps):
        hvd.allreduce_(np.zeros(1, np.float32), op=hvd.Sum, name="sync")
        t0 = time.perf_counter()
        for _ in range(a.calls):
            hvd.allreduce_(buf, op=hvd.Sum, name="lat")
        dt = (time.perf_counter() - t0) / a.calls
        times.append(hvd.allreduce(np.array([dt]), op=hvd.Max, name="t")[0])
    wall = time.monotonic() - wall0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    busy1, _total1 = cpu_jiffies()
    mine = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    ranks_cpu = hvd.allreduce(np.array([mine]), op=hvd.Sum, name="cpu")[0]
    if hvd.rank() == 0:
        hz = 100.0
        machine = (busy1 - busy0) / hz
        others = max(0.0, machine - ranks_cpu) / wall
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
                ranks_cpu / wall,
                others,
            )
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
