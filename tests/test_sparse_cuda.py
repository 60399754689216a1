"""Sharded embedding tables on CUDA tensors: ids, offsets, the dense module and so the shards and
their optimizer state on the GPU; the exchange itself runs through host memory (the core's
alltoall takes host buffers; hvdlite/torch/parallel/sparse/exchange.py copies rows and
gradients across at the holder and at the requester). A one-rank job still goes through the
alltoall path, so this checks the device handling end to end against nn.EmbeddingBag /
nn.Embedding on the same GPU: SGD and row-wise Adagrad, row, column and table sharding, bag
modes sum and mean and plain lookups, duplicate ids and empty bags.

Marked `gpu`: skipped where torch has no CUDA device (tests/gpu_check.sh runs it on a GPU)."""

import pytest
from cuda_skip import skip_without_cuda
from helpers import run_ranks

pytestmark = pytest.mark.gpu

V, D, BAGS, STEPS, LR, EPS = 37, 6, 8, 3, 0.1, 1e-10
CASES = [(s, o) for s in ("row", "column", "table") for o in ("sgd", "adagrad")]
MODES = ("sum", "mean", None)  # one per case, rotating, so every mode meets every sharding


def _batch(torch, step, mode, dev):
    """Bags of 0-4 skewed ids (duplicates; bag 1 empty), or a (BAGS x 3) id matrix for lookups."""
    g = torch.Generator().manual_seed(500 + step)
    if mode is None:
        ids = (torch.rand(BAGS, 3, generator=g) ** 3 * V).long()
        return ids.to(dev), None, torch.randn(BAGS, 3, D, generator=g).to(dev)
    lengths = torch.randint(0, 5, (BAGS,), generator=g)
    lengths[1] = 0
    ids = (torch.rand(int(lengths.sum()), generator=g) ** 3 * V).long()
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return ids.to(dev), offsets.to(dev), torch.randn(BAGS, D, generator=g).to(dev)


def _on_one_gpu(sharding, optimizer, mode):
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    hvd.init()
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    dense = (torch.nn.Embedding(V, D) if mode is None else torch.nn.EmbeddingBag(V, D, mode=mode)).to(dev)
    kind = hvd.parallel.ShardedEmbedding if mode is None else hvd.parallel.ShardedEmbeddingBag
    emb = kind.from_dense(
        dense,
        sharding=sharding,
        optimizer=optimizer,
        lr=LR,
        **({"eps": EPS} if optimizer == "adagrad" else {}),
    )
    W, sum_sq = dense.weight.detach().clone(), torch.zeros(V, device=dev)
    state = [t for o in emb.tables.optimizers.values() for t in o.state.values() if t.dim() > 0]
    out = {"shard_on_gpu": all(t.device == dev for t in [*emb.buffers(), *state]), "worst_out": 0.0}
    for step in range(STEPS):
        ids, offsets, y = _batch(torch, step, mode, dev)
        got = emb(ids) if mode is None else emb(ids, offsets)
        out["out_on_gpu"] = got.device == dev
        w = W.clone().requires_grad_(True)
        ref = F.embedding(ids, w) if mode is None else F.embedding_bag(ids, w, offsets, mode=mode)
        out["worst_out"] = max(out["worst_out"], float((got - ref).abs().max()))
        F.mse_loss(got, y).backward()
        F.mse_loss(ref, y).backward()
        with torch.no_grad():  # the documented rules, dense, on the GPU
            G = w.grad
            if optimizer == "sgd":
                W -= LR * G
            else:
                touched = torch.zeros(V, dtype=torch.bool, device=dev)
                touched[ids.reshape(-1)] = True
                sum_sq += torch.where(touched, G.pow(2).mean(dim=1), torch.zeros_like(sum_sq))
                W -= torch.where(
                    touched.unsqueeze(1), LR * G / (sum_sq.sqrt() + EPS).unsqueeze(1), torch.zeros_like(W)
                )
    full = emb.full_weight()
    out["full_on_gpu"] = full.device == dev
    out["rel_err"] = float((full - W).abs().max() / W.abs().max())
    hvd.shutdown()
    return {k: (bool(v) if isinstance(v, bool) else float(v)) for k, v in out.items()}


@pytest.mark.parametrize("sharding,optimizer", CASES)
def test_sharded_tables_on_cuda_equal_dense_on_cuda(sharding, optimizer):
    skip_without_cuda(need_nccl_module=False)
    mode = MODES[CASES.index((sharding, optimizer)) % len(MODES)]
    out = run_ranks(_on_one_gpu, 1, args=(sharding, optimizer, mode), timeout=180)[0]
    assert out["shard_on_gpu"] and out["out_on_gpu"] and out["full_on_gpu"], out
    assert out["worst_out"] < 1e-5, out
    assert out["rel_err"] < 1e-6, out
