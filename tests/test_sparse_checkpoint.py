"""Checkpoints of sharded embedding tables (hvd.parallel.save_sparse_checkpoint /
load_sparse_checkpoint): saved on 2 ranks under one sharding, loaded under another sharding
(and, in the slow variant, on 3 ranks) into tables initialized differently; the loaded tables
equal the saved ones exactly, and one more step from them equals one more step of the job that
saved (Adam's moments and step count, row-wise Adagrad's accumulators restored)."""

import pytest
from helpers import run_pooled

BAGS, STEPS = 6, 2  # global bags per step (divisible by 2 and 3)


def _model(hvd, torch, sharding, seed):
    torch.manual_seed(seed)
    tables = {"a": torch.nn.EmbeddingBag(30, 6, mode="sum"), "b": torch.nn.Embedding(40, 4)}
    make = hvd.parallel.ShardedEmbeddingCollection.from_dense
    return torch.nn.ModuleDict(
        {
            "x": make(tables, sharding=sharding, optimizer="adam", lr=0.05, name="x"),
            "y": make(tables, sharding=sharding, optimizer="adagrad", lr=0.05, name="y"),
        }
    )


def _step(hvd, torch, model, step):
    n, me = hvd.size(), hvd.rank()
    g = torch.Generator().manual_seed(step)
    batch = {
        "a": torch.randint(0, 30, (BAGS, 3), generator=g),
        "b": torch.randint(0, 40, (BAGS,), generator=g),
    }
    per = BAGS // n
    mine = {k: v[me * per : (me + 1) * per] for k, v in batch.items()}
    loss = sum(o.pow(2).mean() for c in model.values() for o in c(mine).values())
    loss.backward()


def _full(model):
    return {(c, t): model[c].full_weight(t) for c in model for t in ("a", "b")}


def _save_job(path):
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    model = _model(hvd, torch, {"a": "row", "b": "column"}, seed=1)
    for step in range(STEPS):
        _step(hvd, torch, model, step)
    hvd.parallel.save_sparse_checkpoint(path, model)
    saved = _full(model)
    _step(hvd, torch, model, STEPS)
    after = _full(model)
    hvd.shutdown()
    return saved, after


def _load_job(path, sharding, saved, after):
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    model = _model(hvd, torch, sharding, seed=2)
    hvd.parallel.load_sparse_checkpoint(path, model)
    loaded = _full(model)
    _step(hvd, torch, model, STEPS)
    stepped = _full(model)
    hvd.shutdown()
    return {
        "loaded_equal": all(bool((loaded[k] == saved[k]).all()) for k in saved),
        "step_err": max(float((stepped[k] - after[k]).abs().max() / after[k].abs().max()) for k in after),
    }


def _roundtrip(tmp_path, size, sharding):
    saved, after = run_pooled(_save_job, 2, args=(str(tmp_path),), timeout=60)[0]
    for rank, r in enumerate(
        run_pooled(_load_job, size, args=(str(tmp_path), sharding, saved, after), timeout=60)
    ):
        assert r["loaded_equal"], (rank, r)
        assert r["step_err"] <= 1e-5, (rank, r)


def test_reshard_to_another_sharding(tmp_path):
    _roundtrip(tmp_path, 2, {"a": "column", "b": "table"})


@pytest.mark.slow
def test_reshard_to_three_ranks(tmp_path):
    _roundtrip(tmp_path, 3, {"a": "table", "b": "row"})
