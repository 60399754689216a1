"""ZeRO checkpoints (hvd.save_checkpoint / load_checkpoint / consolidate_checkpoint /
full_state_dict): saved on 4 ranks at stage 3, loaded on 2 ranks at stage 1 (hybrid-free) and
on one plain-torch process, training continues identically; consolidation gives a plain
torch.load-able state_dict."""

import json
import os

import numpy as np
import pytest
import torch
import zero_cases as zc
from helpers import run_ranks

BEFORE, AFTER = 2, 2  # steps before the checkpoint, steps after it


def _np(sd):
    return {k: v.numpy().copy() for k, v in sd.items()}


def _save_on_four(path):
    import hvdlite.torch as hvd

    hvd.init()
    model = zc.make_model()
    opt = hvd.ZeroOptimizer(zc.make_optimizer("adamw", model), model, stage=3)
    zc.train_steps(hvd, model, opt, 0, BEFORE)
    hvd.save_checkpoint(path, model, opt)
    at_save = hvd.full_state_dict(model, rank=0)
    zc.train_steps(hvd, model, opt, BEFORE, AFTER)
    final = hvd.full_state_dict(model, rank=0)
    hvd.shutdown()
    return (_np(at_save), _np(final)) if at_save else None  # rank 0 only


def _load_on_two(path, configs):
    import hvdlite.torch as hvd

    hvd.init()
    out = []
    for stage, shard_size in configs:
        torch.manual_seed(123)  # a different initialization: everything must come from the file
        model = zc.Net()
        opt = hvd.ZeroOptimizer(zc.make_optimizer("adamw", model), model, stage=stage, shard_size=shard_size)
        hvd.load_checkpoint(path, model, opt)
        zc.train_steps(hvd, model, opt, BEFORE, AFTER)
        out.append(_np(hvd.full_state_dict(model)))
    hvd.shutdown()
    return out


def _load_plain(path):
    """One process, plain torch (no hvdlite job): the global batch, AdamW's state from the file."""
    import hvdlite.torch as hvd

    torch.manual_seed(321)
    model = zc.Net()
    opt = zc.make_optimizer("adamw", model)
    hvd.load_checkpoint(path, model, opt)
    for step in range(BEFORE, BEFORE + AFTER):
        x, y = zc.batch(step)
        zc.loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()
    out = os.path.join(path, "consolidated.pt")
    hvd.consolidate_checkpoint(path, out)
    return _np({k: v.detach() for k, v in model.state_dict().items()}), _np(
        torch.load(out, weights_only=True)
    )


def _rel(a, b):
    return zc.max_rel_diff(
        {k: torch.from_numpy(v) for k, v in a.items()}, {k: torch.from_numpy(v) for k, v in b.items()}
    )


@pytest.mark.slow
def test_reshard_4_stage3_to_2_stage1_and_one_process(tmp_path):
    path = str(tmp_path / "ckpt")
    at_save, final4 = run_ranks(_save_on_four, 4, args=(path,), timeout=90)[0]
    with open(os.path.join(path, "meta.json")) as f:
        data = json.load(f)["data"]
    assert sorted(os.listdir(path)) == [data, "meta.json"]
    files = sorted(os.listdir(os.path.join(path, data)))
    assert files == ["rest.pt"] + ["shard-%05d-of-00004.pt" % i for i in range(4)], files
    configs = ((1, None), (3, 1))  # stage 1 sharded over 2; stage 3 replicated (shard_size 1)
    results = run_ranks(_load_on_two, 2, args=(path, configs), timeout=90)
    for i, cfg in enumerate(configs):
        for k in results[0][i]:
            assert np.array_equal(results[0][i][k], results[1][i][k]), (cfg, k)
        assert _rel(results[0][i], final4) <= 1e-6, (cfg, _rel(results[0][i], final4))
    plain, consolidated = _load_plain(path)  # in this process: no hvdlite job at all
    assert _rel(plain, final4) <= 1e-6, _rel(plain, final4)
    assert list(consolidated) == list(zc.make_model().state_dict())
    assert _rel(consolidated, at_save) == 0.0
