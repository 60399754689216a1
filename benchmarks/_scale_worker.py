"""One rank of benchmarks/scale.py: waits until every rank has imported hvdlite (a file
barrier, so import time on a loaded machine is not counted), times hvd.init() and a 20-step
4 KiB allreduce loop after a broadcast and an allgather (a data-parallel loop's operations),
then writes what it holds: RSS, shared memory mapped, sockets open. Prints nothing.

    _scale_worker.py BARRIER_DIR OUT_DIR [torch]   (torch: torch.distributed on gloo instead)
"""

import json
import os
import re
import sys
import time

import numpy as np


def _barrier(directory, rank, size):
    open(os.path.join(directory, str(rank)), "w").close()
    while len(os.listdir(directory)) < size:
        time.sleep(0.01)


def _is_own_segment(path, rank):
    """True for this rank's own shared-memory segment (its name ends in r<rank>; unlinked once mapped)."""
    return re.search(r"r%d( \(deleted\))?$" % rank, path.strip()) is not None


def _own_segment_bytes(rank, mapped_own):
    """Memory /dev/shm holds for this rank's own segment: the blocks its file has allocated (the
    rank keeps the unlinked file open; its point-to-point arena is address space until used).
    Falls back to the mapped size where the file is not found."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.startswith("/dev/shm/") and _is_own_segment(target, rank):
            return os.stat("/proc/self/fd/" + fd).st_blocks * 512
    return mapped_own


def _held(rank):
    """RSS (kB), shared memory this rank holds in /dev/shm (bytes: its own segment's allocated
    memory), the address space of every /dev/shm mapping, and its open sockets."""
    with open("/proc/self/status") as f:
        rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
    with open("/proc/self/maps") as f:
        maps = f.readlines()
    own = mapped = 0
    for line in maps:
        if "/dev/shm/" not in line:
            continue
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        mapped += hi - lo
        if _is_own_segment(line, rank):
            own += hi - lo
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink("/proc/self/fd/" + fd).startswith("socket:")
        except OSError:
            pass
    return {"rss_kb": rss, "shm_own": _own_segment_bytes(rank, own), "shm_mapped": mapped, "sockets": sockets}


def _hvdlite(rank, size, barrier):
    import hvdlite as hvd

    _barrier(barrier, rank, size)
    t0 = time.monotonic()
    hvd.init()
    init_s = time.monotonic() - t0
    x = np.ones(1024, np.float32)
    hvd.broadcast(x, 0, name="bcast")
    hvd.allgather(x, name="gather")
    for _ in range(3):
        hvd.allreduce(x, name="warm")
    t0 = time.monotonic()
    for _ in range(20):
        out = hvd.allreduce(x, name="step", op=hvd.Sum)
    loop_s = time.monotonic() - t0
    assert out[0] == size
    held = _held(rank)
    hvd.shutdown()
    return dict(held, init_s=init_s, loop_s=loop_s)


def _torch(rank, size, barrier):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _barrier(barrier, rank, size)
    t0 = time.monotonic()
    dist.init_process_group("gloo", rank=rank, world_size=size)
    init_s = time.monotonic() - t0
    x = torch.ones(1024)
    dist.broadcast(x, 0)
    dist.all_gather([torch.empty_like(x) for _ in range(size)], x)
    for _ in range(3):
        dist.all_reduce(x.fill_(1))
    t0 = time.monotonic()
    for _ in range(20):
        dist.all_reduce(x.fill_(1))
    loop_s = time.monotonic() - t0
    held = _held(rank)
    dist.destroy_process_group()
    return dict(held, init_s=init_s, loop_s=loop_s)


def main():
    barrier, out_dir = sys.argv[1], sys.argv[2]
    peer = len(sys.argv) > 3 and sys.argv[3] == "torch"
    rank = int(os.environ["RANK" if peer else "HVDLITE_RANK"])
    size = int(os.environ["WORLD_SIZE" if peer else "HVDLITE_SIZE"])
    result = (_torch if peer else _hvdlite)(rank, size, barrier)
    with open(os.path.join(out_dir, "%d.json" % rank), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
