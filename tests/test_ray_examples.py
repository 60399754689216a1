"""Horovod 0.28.1's own Ray example, examples/ray/pytorch_ray_elastic.py, run unchanged through
the compat package (`horovod.ray.ElasticRayExecutor` is hvdlite's) on a local two-node Ray
cluster, with compat/examples/run_offline.py's synthetic MNIST in place of the download.

The script is read from Horovod's sources (HOROVOD_SRC or the local mirror, as
tests/horovod_suite.py finds them; nothing of Horovod is in this repository) and skips without
them, or without ray. It asks for `use_gpu=True, cpus_per_slot=2` and calls
`ray.init(address="auto")`: the cluster's two raylets declare 2 CPUs and 1 GPU each (Ray's GPU is
a logical resource; the script's `torch.cuda.is_available()` is False on this machine and it
trains on CPU, as `--no-cuda` asks), so each node holds one slot, and RAY_ADDRESS names the
cluster. The cluster runs in a child process whose raylets (and so every Ray worker) get the
stand-ins, compat and this checkout on their path; nothing here imports `horovod`."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import horovod_suite
import pytest

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parent.parent
STANDINS = REPO / "compat" / "examples" / "standins"

# Starts the cluster, runs the example against it, stops the cluster; exits with the example's
# status. argv: the example, then its arguments.
_DRIVER = """
import os, subprocess, sys
from ray.cluster_utils import Cluster

store = 80 * 2**20
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1,
            "include_dashboard": False, "object_store_memory": store})
c.add_node(num_cpus=2, num_gpus=1, object_store_memory=store)
c.wait_for_nodes()
try:
    env = dict(os.environ, RAY_ADDRESS=c.address)
    code = subprocess.run([sys.executable] + sys.argv[1:], env=env, timeout=420).returncode
finally:
    c.shutdown()
sys.exit(code)
"""


@pytest.mark.slow
def test_horovods_pytorch_ray_elastic_example_runs_unchanged(tmp_path):
    reason = horovod_suite.available()
    if reason:
        pytest.skip(reason)
    kind, path = horovod_suite.source()
    script = tmp_path / "pytorch_ray_elastic.py"
    script.write_text(
        horovod_suite._read(kind, path, horovod_suite.REF, "examples/ray/pytorch_ray_elastic.py")
    )
    offline = runpy.run_path(str(REPO / "compat" / "examples" / "run_offline.py"))
    data = tmp_path / "data"
    npz = offline["write_data"](data)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_", "RAY_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(STANDINS), str(REPO / "compat" / "src"), str(REPO)]),
        HVDLITE_OFFLINE_MNIST_NPZ=str(npz),
        HOME=str(tmp_path),  # the script's FileLock("~/.horovod_lock")
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    args = ["--epochs", "1", "--batch-size", "64", "--no-cuda", "--data-dir", str(data)]
    out = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    log = out.stdout + out.stderr
    (tmp_path / "output.txt").write_text(log)
    assert out.returncode == 0, log[-6000:]
    assert "Test set: Average loss:" in log, log[-6000:]
    assert "Train Epoch: 1 [0/512 (0%)]" in log, log[-6000:]  # 1024 images over 2 workers
