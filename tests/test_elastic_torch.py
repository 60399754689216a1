"""Elastic PyTorch training (TorchState, ElasticSampler, DistributedOptimizer) losing a worker:
tests/elastic_torch_train.py under `hvdliterun --min-np`, one worker SIGKILLed or frozen
(SIGSTOP) in step 5; the committed steps, replayed with plain SGD on one process, give the final
parameters."""

import sys

import numpy as np
import pytest
from test_elastic import HOSTS3, REPO, done_of, hvdliterun

pytestmark = pytest.mark.elastic


@pytest.mark.slow
def test_torch_state_and_elastic_sampler_recover_a_killed_worker():
    check_torch_recovery({})


def check_torch_recovery(extra_env):
    """tests/elastic_torch_train.py on 3 hosts, 127.0.0.2[0] lost in step 5 (SIGKILL, or as
    extra_env says): the committed steps replayed on one process give the final parameters."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(REPO / "tests"))
    import elastic_torch_train as train

    env = {"ELASTIC_KILL": "127.0.0.2[0]:5", **extra_env}
    script = str(REPO / "tests" / "elastic_torch_train.py")
    res = hvdliterun("-np", 3, "--min-np", 2, "-H", HOSTS3, sys.executable, script, env=env, timeout=150)
    assert res.returncode == 0, res.stderr[-4000:]
    log, params = done_of(res)
    assert [step for step, _ in log] == list(range(len(log)))
    assert [len(batches) for _, batches in log] == [3] * 5 + [2] * 5
    # ElasticSampler: the rest of epoch 1 was re-partitioned; every sample done once per epoch
    seen = sorted(i for _, batches in log for batch in batches for i in batch)
    assert seen == sorted(list(range(train.N)) * train.EPOCHS)
    # replay the committed steps with plain SGD on one process
    x, y = train.data()
    net = train.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _, batches in log:
        grads = []
        for batch in batches:
            net.zero_grad()
            torch.nn.functional.mse_loss(net(x[batch]), y[batch]).backward()
            grads.append([p.grad.clone() for p in net.parameters()])
        for p, *gs in zip(net.parameters(), *grads):
            p.grad = sum(gs) / len(gs)
        opt.step()
    for got, want in zip(params, net.parameters()):
        np.testing.assert_allclose(np.array(got), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    return res


# Slow (~10 s): the frozen worker is found by the heartbeat (4 s), reported, killed and dropped.
@pytest.mark.slow
def test_torch_state_recovers_a_frozen_worker():
    res = check_torch_recovery({"ELASTIC_KILL_SIGNAL": "SIGSTOP"})
    assert "127.0.0.2[0] (rank 2 of generation 1, host 127.0.0.2) stopped responding" in res.stderr
