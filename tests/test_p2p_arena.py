"""The point-to-point arena (csrc/runtime/p2p_arena.h) when /dev/shm cannot hold it: the job
runs in a mount namespace whose /dev/shm is a 4 MiB tmpfs, enough for the transport's rings but
not for a 4 MiB piece, so the sender's reservation fails. The lane must turn off with a warning
and the message arrive whole through the control ring: never a SIGBUS from writing an unbacked
page. Needs root and mount namespaces (skips with the reason otherwise)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = """
import numpy as np
import hvdlite as hvd

hvd.init()
n = 3 << 20  # 12 MiB: pieces of 4 MiB, more than the 4 MiB /dev/shm can back
if hvd.rank() == 0:
    hvd.send(np.arange(n, dtype=np.float32), 1, tag=3)
    small = np.arange(1 << 16, dtype=np.float32)  # 256 KiB: fits what is left, but the lane is off
    hvd.send(small, 1, tag=4)
else:
    got = hvd.recv(np.zeros(n, np.float32), 0, tag=3)
    assert np.array_equal(got, np.arange(n, dtype=np.float32)), "12 MiB message corrupted"
    got = hvd.recv(np.zeros(1 << 16, np.float32), 0, tag=4)
    assert np.array_equal(got, np.arange(1 << 16, dtype=np.float32)), "256 KiB message corrupted"
    print("RECEIVED OK", flush=True)
hvd.shutdown()
"""


def _namespaces_reason():
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs on /dev/shm in a mount namespace"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m hvdprobe /dev/shm"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return "mount namespaces are not permitted here: " + (probe.stderr.strip() or "unshare failed")
    return None


def test_full_dev_shm_turns_the_arena_off_and_messages_still_arrive(tmp_path):
    reason = _namespaces_reason()
    if reason:
        pytest.skip(reason)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", HVDLITE_TIMEOUT_SECONDS="60")
    launch = "%s -m hvdlite.runner.launch -np 2 %s %s" % (sys.executable, sys.executable, script)
    res = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4m hvdsmall /dev/shm && exec " + launch],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "RECEIVED OK" in out, out[-4000:]
    assert "/dev/shm is full or too small" in out, out[-4000:]
    assert "go through the control ring from now on" in out, out[-4000:]
