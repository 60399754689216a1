"""64 real ranks on this host: results right, and what each rank holds stays small (issue 29).

Each rank runs benchmarks/_scale_worker.py under hvdliterun: hvd.init(), a broadcast, an
allgather and 20 allreduces (it checks the sum), then reports the shared memory it maps and
the sockets it holds. Shared memory per host grows with the ranks (partner rings sharing a
fixed budget per rank), not with their pairs, and a rank holds sockets only to the peers its
algorithms use. No time is asserted (benchmarks/scale.py measures init time).
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "benchmarks", "_scale_worker.py")
N = 64


def test_64_ranks_on_one_host(tmp_path):
    barrier, out = tmp_path / "barrier", tmp_path / "out"
    barrier.mkdir()
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "hvdlite.runner.launch", "-np", str(N), sys.executable, WORKER]
    res = subprocess.run(
        argv + [str(barrier), str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    ranks = [json.loads((out / name).read_text()) for name in os.listdir(out)]
    assert len(ranks) == N
    shm_host = sum(r["shm_own"] for r in ranks)
    sockets = sorted(r["sockets"] for r in ranks)
    print(
        "64 ranks: /dev/shm %.1f MiB in all; sockets per rank: median %d, most %d; RSS median %d MB"
        % (shm_host / 2**20, sockets[N // 2], sockets[-1], sorted(r["rss_kb"] for r in ranks)[N // 2] // 1024)
    )
    assert shm_host <= 256 * 2**20, shm_host  # the full mesh of rings took 4.3 GB
    assert all(r["shm_own"] > 0 for r in ranks)  # every rank did use shared memory
    # Transport sockets plus the rank's listener and its store client.
    assert sockets[-1] <= 16, sockets
