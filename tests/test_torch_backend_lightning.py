"""Lightning's DDPStrategy and FSDPStrategy with process_group_backend="hvdlite" train as one
process does (tests/torch_backend_lightning.py)."""

import socket

import pytest
import torch_backend_lightning as lightning_case
from helpers import run_ranks

pytest.importorskip(
    "lightning", reason="Lightning is installed by `make install` (requirements-torch-nodeps.txt)"
)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp"])  # Lightning itself refuses FSDPStrategy on CPU
def test_lightning_strategy_on_hvdlite_trains_as_on_gloo(strategy):
    def run(backend):
        port = _port()

        def env(rank):  # what a cluster launcher (torchrun, Kubernetes) gives each process
            names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")
            values = ("127.0.0.1", str(port), "2", str(rank), str(rank), "0")
            return dict(zip(names, values), LOCAL_WORLD_SIZE="2", CASE_BACKEND=backend)

        return run_ranks(lightning_case.train, 2, args=(strategy,), env=env, timeout=180)

    ours, gloo = run("hvdlite"), run("gloo")
    assert [b for b, _ in ours] == ["hvdlite"] * 2 and [b for b, _ in gloo] == ["gloo"] * 2
    for (_, mine), (_, theirs) in zip(ours, gloo):
        assert max(abs(a - b) for k, v in theirs.items() for a, b in zip(mine[k], v)) < 1e-6
    assert ours[0][1] == ours[1][1]  # replicas identical
