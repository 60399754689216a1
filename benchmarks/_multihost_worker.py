"""One rank of benchmarks/multihost.py: allreduce or allgather busbw over a size sweep with one
library.

    _multihost_worker.py MODE SIZES ITERS RATE_BPS OP [GLOO_ADDR GLOO_PORT]

MODE: hvdlite (started by hvdliterun -H), mpi (mpirun -H, mpi4py) or gloo (hvdliterun -H for
the rank variables, torch.distributed's gloo for the work). Rank 0 prints one JSON line per
size: seconds per operation, busbw (nccl-tests' 2(n-1)/n for allreduce, (n-1)/n for allgather,
SIZE being the gathered bytes), and how busy its host's link was (bytes its interface sent
during the timed loop / (time * RATE_BPS)). OP: allreduce or allgather.
"""

import json
import os
import sys
import time

import numpy as np


def _tx_bytes():
    """Bytes sent so far by this host's one non-loopback interface (its own netns view)."""
    total = 0
    for name in os.listdir("/sys/class/net"):
        if name != "lo":
            with open("/sys/class/net/%s/statistics/tx_bytes" % name) as f:
                total += int(f.read())
    return total


def _setup(mode, op, argv):
    """Returns (rank, size, fn): fn(x) runs `op` on x (allgather: x is this rank's part)."""
    if mode == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if op == "allgather":
            return (
                comm.Get_rank(),
                comm.Get_size(),
                lambda x: comm.Allgather(x, np.empty(x.size * comm.Get_size(), x.dtype)),
            )
        return comm.Get_rank(), comm.Get_size(), lambda x: comm.Allreduce(MPI.IN_PLACE, x)
    if mode == "gloo":
        import torch
        import torch.distributed as dist

        rank, size = int(os.environ["HVDLITE_RANK"]), int(os.environ["HVDLITE_SIZE"])
        dist.init_process_group(
            "gloo", init_method="tcp://%s:%s" % (argv[0], argv[1]), rank=rank, world_size=size
        )
        if op == "allgather":

            def gather(x):
                t = torch.from_numpy(x)
                dist.all_gather([torch.empty_like(t) for _ in range(size)], t)

            return rank, size, gather
        return rank, size, lambda x: dist.all_reduce(torch.from_numpy(x))
    import hvdlite as hvd

    hvd.init()
    if op == "allgather":
        return hvd.rank(), hvd.size(), lambda x: hvd.allgather(x, name="g%d" % x.nbytes)
    return hvd.rank(), hvd.size(), lambda x: hvd.allreduce_(x, op=hvd.Sum, name="x%d" % x.nbytes)


def main():
    mode, sizes, iters, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    op = sys.argv[5]
    rank, n, allreduce = _setup(mode, op, sys.argv[6:])
    for nbytes in (int(s) for s in sizes.split(",")):
        x = np.ones(nbytes // 4 // (n if op == "allgather" else 1), np.float32)
        allreduce(x)
        allreduce(x)  # warm-up: connections, caches
        sent, start = _tx_bytes(), time.perf_counter()
        for _ in range(iters):
            allreduce(x)
        dt = (time.perf_counter() - start) / iters
        util = (_tx_bytes() - sent) * 8 / (dt * iters * rate)
        if rank == 0:
            busbw = nbytes * (1 if op == "allgather" else 2) * (n - 1) / n / dt * 8 / 1e9
            print(
                json.dumps({"mode": mode, "bytes": nbytes, "s": dt, "busbw_gbit": busbw, "link": util}),
                flush=True,
            )


if __name__ == "__main__":
    main()
