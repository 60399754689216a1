"""Data, tensor and pipeline parallelism together on one hvd.Mesh: dp=2 x tp=2 and
pp=2 x tp=2 on 4 ranks (and dp x pp x tp on 8, slow) give the gradients of one process on
the whole batch. Stages are residual MLP blocks whose two linears are column- and
row-parallel; gradients are averaged over the dp axis after the step."""

import numpy as np
import pytest
from helpers import run_pooled

WIDTH, HIDDEN, ROWS = 6, 10, 12


def _dense_blocks(n):
    import torch
    from torch import nn

    torch.manual_seed(0)
    blocks = []
    for i in range(n):
        b = nn.Module()
        b.fc1, b.fc2 = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)
        b.head = nn.Linear(WIDTH, 3) if i == n - 1 else None
        blocks.append(b)
    return blocks


def _block_forward(b, x):
    import torch.nn.functional as F

    h = x + b.fc2(F.gelu(b.fc1(x)))
    return b.head(h) if b.head is not None else h


def _batch():
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(ROWS, WIDTH, generator=g), torch.randn(ROWS, 3, generator=g)


def _reference(n):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    blocks = _dense_blocks(n)
    x, y = _batch()
    h = x
    for b in blocks:
        h = _block_forward(b, h)
    F.mse_loss(h, y).backward()
    return {
        (i, name): p.grad.numpy().copy() for i, b in enumerate(blocks) for name, p in b.named_parameters()
    }


def _mesh_body(sizes, n_microbatches):
    import torch
    import torch.nn.functional as F
    from torch import nn

    import hvdlite.torch as hvd
    from hvdlite.torch.conjugate import partition

    torch.set_num_threads(1)
    hvd.init()
    mesh = hvd.Mesh(**sizes)
    tp, dp, pp = mesh.process_set("tp"), mesh.process_set("dp"), mesh.process_set("pp")
    P, n_stages, me = hvd.parallel, mesh.size("pp"), mesh.rank("pp")

    class Block(nn.Module):
        def __init__(self, dense):
            super().__init__()
            self.fc1 = P.ColumnParallelLinear.from_dense(dense.fc1, process_set=tp)
            self.fc2 = P.RowParallelLinear.from_dense(dense.fc2, process_set=tp)
            self.head = dense.head

        def forward(self, x):
            return _block_forward(self, x)

    stage = Block(_dense_blocks(n_stages)[me])
    x, y = _batch()
    r0, n = partition(ROWS, mesh.size("dp"), mesh.rank("dp"))
    x, y = x[r0 : r0 + n], y[r0 : r0 + n]
    if n_stages == 1:
        F.mse_loss(stage(x), y).backward()
    else:
        sched = P.Schedule1F1B(
            P.PipelineStage(stage, me, n_stages, process_set=pp), n_microbatches, F.mse_loss
        )
        sched.step(x, target=y)
    out = {}
    for name, p in stage.named_parameters():
        grad = hvd.allreduce(p.grad, op=hvd.Average, name="dp." + name, process_set=dp)
        layer = name.split(".")[0]
        sliced = None
        if name.endswith("weight") and layer in ("fc1", "fc2"):
            sliced = (
                0 if layer == "fc1" else 1,
                getattr(stage, layer).start,
                grad.shape[0 if layer == "fc1" else 1],
            )
        elif name == "fc1.bias":
            sliced = (0, stage.fc1.start, grad.shape[0])
        out[(me, name)] = (grad.numpy().copy(), sliced)
    coords = tuple(mesh.coords)
    hvd.shutdown()
    return coords, out


def _check(sizes, n_microbatches, world):
    outs = run_pooled(_mesh_body, world, args=(sizes, n_microbatches), timeout=150)
    ref = _reference(max(1, sizes.get("pp", 1)))
    by_key: dict = {}
    for coords, out in outs:
        for key, (grad, sliced) in out.items():
            want = ref[key]
            if sliced is not None:
                dim, start, n = sliced
                want = want[start : start + n] if dim == 0 else want[:, start : start + n]
            np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6, err_msg=str((coords, key)))
            by_key.setdefault((coords[-1] if sliced else None, key), []).append(grad)  # coords[-1]: tp
    # dp replicas (and tp replicas of replicated parameters) hold the same bits
    for key, grads in by_key.items():
        assert all(np.array_equal(g, grads[0]) for g in grads), key


def test_dp2_tp2_equals_one_process():
    _check({"dp": 2, "tp": 2}, 1, 4)


def test_pp2_tp2_equals_one_process():
    _check({"pp": 2, "dp": 1, "tp": 2}, 3, 4)


@pytest.mark.slow
def test_dp2_pp2_tp2_on_eight_ranks():
    _check({"pp": 2, "dp": 2, "tp": 2}, 2, 8)
