"""Compressing only the cross-host stage (cross_host_only, the default where the job spans
hosts with 2+ ranks each): on 4 ranks claiming 2 hosts through HVDLITE_HOSTNAME, the
gradients are summed exactly inside each host, the compressor works on the host sums among
the hosts' first ranks, and every rank gets the same bits. Checked against the same
compressor applied by hand to the host sums; ranks that do not form hosts of consecutive
ranks fall back to compressing every hop."""

import numpy as np
import pytest
import torch
from helpers import run_ranks

pytestmark = pytest.mark.slow

# The compressed weights and the rows of one sign chunk (chunk 256: 16 rows of 16, 4 of 64).
CHUNK_ROWS = {"0.weight": 16, "2.weight": 4}


def _hosts_env(hosts):
    """Per rank: the host it claims and the topology a launcher would give it."""

    def env(rank):
        names = sorted(set(hosts))
        mine = [r for r, h in enumerate(hosts) if h == hosts[rank]]
        return {
            "HVDLITE_HOSTNAME": hosts[rank],
            "HVDLITE_LOCAL_RANK": mine.index(rank),
            "HVDLITE_LOCAL_SIZE": len(mine),
            "HVDLITE_CROSS_RANK": names.index(hosts[rank]),
            "HVDLITE_CROSS_SIZE": len(names),
        }

    return env


def _first_step(cross):
    import hvdlite.torch as hvd

    hvd.init()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    g = torch.Generator().manual_seed(10 + hvd.rank())
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    compression = hvd.Compression.sign(min_numel=256, cross_host_only=cross)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        compression=compression,
    )
    loss = torch.nn.functional.mse_loss(model(x), y)
    # This rank's own gradients, taken before backward: backward's hooks start the allreduces,
    # and the uncompressed ones reduce p.grad in place while this thread runs on.
    names, params = zip(*model.named_parameters())
    local = dict(zip(names, torch.autograd.grad(loss, params, retain_graph=True)))
    loss.backward()
    opt.synchronize()
    out = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    every = {n: hvd.allgather(t[None], name="g." + n).numpy() for n, t in local.items()}
    topo = (hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    return bool(compression._two_level_sets), out, every, compression.bytes_submitted, topo


def _sign(m, chunk_rows):
    """Scaled sign of a float32 matrix, one scale per `chunk_rows` rows."""
    rows = m.reshape(-1, chunk_rows * m.shape[1])
    scales = np.abs(rows).mean(1, keepdims=True, dtype=np.float32)
    return np.copysign(np.broadcast_to(scales, rows.shape), rows).reshape(m.shape)


@pytest.mark.parametrize("hosts", [["a", "a", "b", "b"], ["a", "b", "a", "b"]], ids=["2x2", "interleaved"])
def test_cross_host_only_compresses_the_host_sums(hosts):
    results = run_ranks(_first_step, 4, args=(None,), env=_hosts_env(hosts), timeout=90)
    two_level = hosts == ["a", "a", "b", "b"]
    for used, out, _, _, _ in results:
        assert used == two_level, [r[4] for r in results]
        for name, value in out.items():
            assert value.tobytes() == results[0][1][name].tobytes(), name  # replicas identical
    _, out, every, _, _ = results[0]
    for name, grads in every.items():
        if name not in CHUNK_ROWS:  # the biases (1-D): the exact allreduce
            np.testing.assert_allclose(out[name], grads.mean(0), rtol=1e-5, atol=1e-7)
            continue
        if two_level:
            parts = [grads[0] + grads[1], grads[2] + grads[3]]  # host sums, compressed
        else:
            parts = list(grads)  # every rank's own gradient, compressed
        expected = sum(_sign(p, CHUNK_ROWS[name]) for p in parts) / 4
        np.testing.assert_allclose(out[name], expected, rtol=1e-5, atol=1e-7)
    # Only a host's first rank sends compressed bytes across hosts.
    sent = [r[3] for r in results]
    assert (sent[1] == 0 and sent[3] == 0) if two_level else min(sent) > 0, sent


def test_cross_host_only_false_compresses_every_hop():
    results = run_ranks(_first_step, 4, args=(False,), env=_hosts_env("aabb"), timeout=90)
    assert not any(r[0] for r in results)
