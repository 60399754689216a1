"""The shared-memory transport between ranks on one host, through the whole runtime:
it is chosen automatically (HVDLITE_SHM_DISABLE=1 falls back to TCP), every collective is
correct over it, a rank killed during a transfer is reported promptly, and no segment is
left in /dev/shm after a job, even a killed one. (test_collectives.py runs the full
dtype/op/count matrix, over shared memory too since its ranks share a host.)"""

import hashlib
import hmac
import os
import threading
import time

import numpy as np
import pytest
from helpers import run_ranks, spawn_ranks


def _job_tag():
    """The prefix of this job's segment names (see csrc/transport/shm_setup.cc)."""
    secret = bytes.fromhex(os.environ["HVDLITE_SECRET"])
    return "hvdlite-" + hmac.new(secret, b"hvdlite-shm-segment", hashlib.sha256).hexdigest()[:16]


def _leftovers(tag):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(tag))


def _capture_stderr(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)


def _every_collective(log_dir):
    _capture_stderr(os.path.join(log_dir, "rank%s.err" % os.environ["HVDLITE_RANK"]))
    import hvdlite as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {"tag": _job_tag()}
    for count in (0, 1, 1000, 3 * 1024 * 1024 + 7):  # the last spans many ring slots
        x = (np.arange(count) % 13 + r).astype(np.float32)
        out["allreduce", count] = hvd.allreduce(x, op=hvd.Sum, name="ar%d" % count).tobytes()
        out["allgather", count] = hvd.allgather(x[: count // (r + 1)], name="ag%d" % count).tobytes()
        y = x.copy() if r == n - 1 else np.zeros_like(x)
        out["broadcast", count] = hvd.broadcast(y, root_rank=n - 1, name="bc%d" % count).tobytes()
        rows = (np.arange(n * (count // 4 + 1)) * (r + 1)).astype(np.float64).reshape(n, -1)
        out["alltoall", count] = hvd.alltoall(rows, name="a2a%d" % count).tobytes()
        out["reducescatter", count] = hvd.reducescatter(rows, op=hvd.Sum, name="rs%d" % count).tobytes()
    hvd.shutdown()
    out["leftovers"] = _leftovers(out["tag"])
    return out


def _expected(kind, count, r, n):
    xs = [(np.arange(count) % 13 + q).astype(np.float32) for q in range(n)]
    if kind == "allreduce":
        return np.sum(xs, axis=0, dtype=np.float32).tobytes()
    if kind == "allgather":
        return np.concatenate([xs[q][: count // (q + 1)] for q in range(n)]).tobytes()
    if kind == "broadcast":
        return xs[n - 1].tobytes()
    rows = [(np.arange(n * (count // 4 + 1)) * (q + 1)).astype(np.float64).reshape(n, -1) for q in range(n)]
    if kind == "alltoall":
        return np.concatenate([rows[q][r : r + 1] for q in range(n)]).tobytes()
    total = np.sum(rows, axis=0)
    return total[r : r + 1].tobytes()


@pytest.mark.parametrize(
    "size", [1, 2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("disable", [False, True])
def test_every_collective_over_shm_or_tcp(size, disable, tmp_path):
    env = {
        "HVDLITE_LOG_LEVEL": "debug",
        "HVDLITE_SHM_DISABLE": "1" if disable else None,
        "HVDLITE_SHM_CHANNEL_BYTES": str(256 * 1024),
    }
    results = run_ranks(_every_collective, size, args=(str(tmp_path),), env=env, timeout=120)
    for r, out in enumerate(results):
        for key, got in out.items():
            if key in ("tag", "leftovers"):
                continue
            assert got == _expected(key[0], key[1], r, size), (key, r)
        assert out["leftovers"] == []
        log = (tmp_path / ("rank%d.err" % r)).read_text()
        uses_shm = "shared memory with %d of %d partners on this host" % (size - 1, size - 1) in log
        assert uses_shm == (size > 1 and not disable), log[-2000:]


def _killed_during_transfer(victim):
    import hvdlite as hvd

    hvd.init()
    tag = _job_tag()
    big = np.ones(8 * 1024 * 1024, np.float32)  # 32 MiB: many ring slots per step
    hvd.allreduce_(big, op=hvd.Sum, name="warm")
    if hvd.rank() == victim:
        threading.Timer(0.2, lambda: os.kill(os.getpid(), 9)).start()
    started = time.monotonic()
    try:
        for i in range(1000):
            hvd.allreduce_(big, op=hvd.Sum, name="big%d" % i)
        error = None
    except hvd.HvdliteError as e:
        error = str(e)
    elapsed = time.monotonic() - started
    hvd.shutdown()
    return tag, error, elapsed


@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_rank_killed_during_shm_transfer_is_reported_promptly_and_leaves_nothing(size):
    victim = size - 1
    # Detection must come from liveness, not the transfer timeout: the job's own
    # timeout (60 s) is shorter than HVDLITE_TIMEOUT_SECONDS, so a rank that only
    # noticed through the transfer timeout would make spawn_ranks fail.
    env = {"HVDLITE_TIMEOUT_SECONDS": "600"}
    results = spawn_ranks(_killed_during_transfer, size, args=(victim,), env=env, timeout=60)
    assert results[victim].exitcode == -9
    for res in results[:victim]:
        assert res.traceback is None, res.traceback
        tag, error, _ = res.value
        assert error is not None and "rank %d" % victim in error, error
        assert _leftovers(tag) == []


def test_launcher_removes_segments_a_killed_init_left_behind():
    from hvdlite.runner.launch import remove_shm_leftovers

    secret = os.urandom(32)
    tag = "hvdlite-" + hmac.new(secret, b"hvdlite-shm-segment", hashlib.sha256).hexdigest()[:16]
    other = "hvdlite-0123456789abcdef-e1_r0"
    for name in (tag + "-e1_r0", tag + "-e1_r1", other):
        with open(os.path.join("/dev/shm", name), "wb") as f:
            f.write(b"x")
    try:
        remove_shm_leftovers(secret)
        assert _leftovers(tag) == []
        assert os.path.exists(os.path.join("/dev/shm", other)), "another job's segment was removed"
    finally:
        for name in (tag + "-e1_r0", tag + "-e1_r1", other):
            if os.path.exists(os.path.join("/dev/shm", name)):
                os.unlink(os.path.join("/dev/shm", name))
