"""hvdlite's CPU data paths under mpirun, side by side: the native ring
(HVDLITE_CPU_OPERATIONS=ring), the mpi backend (=mpi) and the default (=auto: the
per-collective choice in csrc/backend/registry.cc, made from this script's numbers). A helper (make bench skips it), run by hand
when a data path changes, and a module with measure() for other scripts:

    python benchmarks/_mpi_path.py [--np 2] [--sizes 4096,1048576,...] [--reps 20]

measure(np, path, ...) launches `mpirun -n NP --oversubscribe --bind-to none` with this file
as the worker, one compute thread per rank, and returns one row per (collective, size):
    {"path", "op", "bytes", "median_s", "min_s", "algbw", "busbw", "wrong", "others_cpu"}
following shared/BENCHMARKING.md: a correctness pass with rank-dependent data first
(`wrong` = elements that differ from the NumPy reference, on any rank), warm-up, then `reps`
repetitions each starting after a barrier, the max over ranks per repetition, median and min
over repetitions; messages <= 1 MiB time K back-to-back calls per repetition. Buffers are
float32, touched before timing and zero while timed, reduced in place. `others_cpu` is the
share of the machine's CPU that processes other than the ranks used during the run (re-run
when it is above ~10%). Nothing here asserts a time.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
DEFAULT_SIZES = (4096, 65536, 1 << 20, 16 << 20, 64 << 20)
_BUSBW = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1.0) / n,
    "broadcast": lambda n: 1.0,
    "alltoall": lambda n: (n - 1.0) / n,
    "reducescatter": lambda n: (n - 1.0) / n,
}


def _cpu_jiffies():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def measure(np_ranks, path, ops=OPS, sizes=DEFAULT_SIZES, reps=20, timeout=600):
    """Runs the worker under mpirun with HVDLITE_CPU_OPERATIONS=path; returns its rows."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun not found (make install installs Open MPI)")
    with tempfile.TemporaryDirectory(prefix="hvdlite-mpi-path-") as tmp:
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, HVDLITE_CPU_OPERATIONS=path, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for name in ("RANK", "SIZE", "STORE_ADDR", "SECRET", "LOCAL_RANK", "LOCAL_SIZE"):
            env.pop("HVDLITE_" + name, None)
        if os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        argv = [
            mpirun,
            "-n",
            str(np_ranks),
            "--oversubscribe",
            "--bind-to",
            "none",
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--out",
            out,
            "--ops",
            ",".join(ops),
            "--sizes",
            ",".join(str(s) for s in sizes),
            "--reps",
            str(reps),
        ]
        busy0, total0 = _cpu_jiffies()
        own0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, env=env, check=True, timeout=timeout)
        own1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy1, total1 = _cpu_jiffies()
        with open(out) as f:
            rows = json.load(f)
    hz = os.sysconf("SC_CLK_TCK")
    own = (own1.ru_utime - own0.ru_utime) + (own1.ru_stime - own0.ru_stime)
    others = max(0.0, (busy1 - busy0) / hz - own) / max(1e-9, (total1 - total0) / hz)
    for row in rows:
        row.update(path=path, others_cpu=others)
    return rows


# ---- worker (runs on every rank under mpirun) ----


def _expected(op, count, n, root=0):
    import numpy as np

    if op == "allreduce":
        return np.full(count, sum(r + 1 for r in range(n)), np.float32)
    if op == "allgather":
        return np.concatenate([np.full(count, r + 1, np.float32) for r in range(n)])
    if op == "alltoall":  # block r of the result comes from rank r
        return np.repeat(np.arange(1, n + 1, dtype=np.float32), count // n)
    if op == "reducescatter":
        return np.full(count // n, sum(r + 1 for r in range(n)), np.float32)
    return np.full(count, root + 1, np.float32)


def _call(hvd, op, buf, name):
    if op == "allreduce":
        return hvd.allreduce_(buf, op=hvd.Sum, name=name)
    if op == "allgather":
        return hvd.allgather(buf, name=name)
    if op == "alltoall":
        return hvd.alltoall(buf, name=name)
    if op == "reducescatter":
        return hvd.reducescatter(buf, op=hvd.Sum, name=name)
    return hvd.broadcast_(buf, root_rank=0, name=name)


def _time_one(hvd, op, nbytes, reps):
    """(wrong, [seconds per call, max over ranks, one per repetition])."""
    import numpy as np

    n, me = hvd.size(), hvd.rank()
    count = max(1, nbytes // 4 // (n if op == "allgather" else 1))
    if op in ("alltoall", "reducescatter"):  # the whole array, split evenly among the ranks
        count = max(n, count // n * n)
    got = _call(hvd, op, np.full(count, me + 1, np.float32), "%s.check.%d" % (op, nbytes))
    wrong = int(np.count_nonzero(got != _expected(op, count, n)))
    wrong = int(hvd.allreduce(np.array([wrong], np.int64), op=hvd.Sum, name="wrong.%s.%d" % (op, nbytes))[0])
    buf = np.zeros(count, np.float32)
    inner = 20 if nbytes <= (1 << 20) else 1
    for _i in range(3):
        _call(hvd, op, buf, "%s.warm.%d" % (op, nbytes))
    times = []
    for _rep in range(reps):
        hvd.barrier()
        start = time.perf_counter()
        for _i in range(inner):
            _call(hvd, op, buf, "%s.%d" % (op, nbytes))
        mine = (time.perf_counter() - start) / inner
        times.append(float(hvd.allreduce(np.array([mine]), op=hvd.Max, name="t.%s.%d" % (op, nbytes))[0]))
    return wrong, times


def _worker(args):
    import numpy as np

    import hvdlite as hvd

    hvd.init()
    rows = []
    for op in args.ops.split(","):
        for nbytes in (int(s) for s in args.sizes.split(",")):
            wrong, times = _time_one(hvd, op, nbytes, args.reps)
            med = float(np.median(times))
            rows.append(
                dict(
                    op=op,
                    bytes=nbytes,
                    median_s=med,
                    min_s=min(times),
                    wrong=wrong,
                    algbw=nbytes / med / 1e9,
                    busbw=nbytes / med / 1e9 * _BUSBW[op](hvd.size()),
                    np=hvd.size(),
                )
            )
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f)
    hvd.shutdown()


def _fmt_size(b):
    return "%d MiB" % (b >> 20) if b >= (1 << 20) else "%d KiB" % (b >> 10)


def _report(by_path):
    paths = list(by_path)
    print(
        "%-10s %-8s" % ("op", "size")
        + "".join("%14s" % p for p in paths)
        + "".join("%12s" % (p + " busbw") for p in paths)
        + "%10s %6s" % ("ring/mpi", "#wrong")
    )

    def t(row):
        s = row["median_s"]
        return "%.1f us" % (s * 1e6) if s < 1e-3 else "%.2f ms" % (s * 1e3)

    for rows in zip(*(by_path[p] for p in paths)):
        first = rows[0]
        line = "%-10s %-8s" % (first["op"], _fmt_size(first["bytes"]))
        line += "".join("%14s" % t(r) for r in rows) + "".join("%7.2f GB/s" % r["busbw"] for r in rows)
        ring, mpi = rows[paths.index("ring")], rows[paths.index("mpi")]
        line += "%9.2fx %6d" % (ring["median_s"] / mpi["median_s"], sum(r["wrong"] for r in rows))
        print(line)
    print(
        "others' CPU during the runs: "
        + ", ".join("%s %.0f%%" % (p, 100 * by_path[p][0]["others_cpu"]) for p in paths)
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument(
        "--paths",
        default="ring,mpi,auto",
        help="HVDLITE_CPU_OPERATIONS values to compare (ring and mpi are required)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    by_path = {
        path: measure(args.np, path, args.ops.split(","), sizes, args.reps) for path in args.paths.split(",")
    }
    print(
        "hvdlite CPU data paths under mpirun -n %d (one compute thread per rank), float32, median of %d"
        % (args.np, args.reps)
    )
    _report(by_path)


if __name__ == "__main__":
    main()
