"""ZeRO stages 1-3 (hvdlite.torch.ZeroOptimizer): equivalence with one process on the
concatenated batch, bitwise-identical replicas, the error paths, gradient clipping and
accumulation. Checkpoints and memory: tests/test_zero_checkpoint.py."""

import numpy as np
import pytest
import torch
import zero_cases as zc
from helpers import run_pooled

STEPS = 4


def _configs(size):
    hybrid = 2 if size == 4 else 1
    out = []
    for stage in (1, 2, 3):
        for shard_size in (None, hybrid):
            for kind in ("sgd", "adamw"):
                out.append((stage, shard_size, kind))
    return out


def _train(stage, shard_size, kind, bucket_numel=None, clip=None, passes=1, mixed=None):
    import hvdlite.torch as hvd

    model = zc.make_model()
    opt = hvd.ZeroOptimizer(
        zc.make_optimizer(kind, model),
        model,
        stage=stage,
        shard_size=shard_size,
        bucket_numel=bucket_numel,
        backward_passes_per_step=passes,
        mixed_precision=mixed,
    )
    for step in range(STEPS):
        x, y = zc.local_batch(step, hvd.rank(), hvd.size())
        if passes == 1:
            zc.loss_of(model, x, y).backward()
        else:  # the same local batch in `passes` micro-batches, losses scaled to the mean
            for xm, ym in zip(x.chunk(passes), y.chunk(passes)):
                (zc.loss_of(model, xm, ym) / passes).backward()
        if clip is not None:
            opt.clip_grad_norm_(clip)
        opt.step()
        opt.zero_grad()
    full = hvd.full_state_dict(model)
    live = None
    if stage < 3:
        live = {n: p.detach().clone() for n, p in model.named_parameters()}
    return full, live


def _np(tensors):
    """numpy copies: torch tensors sent back over the helper's pipe would travel as shared
    memory that dies with the rank."""
    return None if tensors is None else {k: v.numpy().copy() for k, v in tensors.items()}


def _subsets(refs):
    """4 ranks as two independent data-parallel sets [0, 1] and [2, 3] (a mesh's dp sets):
    each set trains the whole global batch split over its 2 ranks, plain and hybrid."""
    import hvdlite.torch as hvd

    sets = [hvd.add_process_set([0, 1]), hvd.add_process_set([2, 3])]
    mine = sets[hvd.rank() // 2]
    out = {}
    for stage, shard_size in ((2, None), (3, 1)):
        model = zc.make_model()
        opt = hvd.ZeroOptimizer(
            zc.make_optimizer("adamw", model), model, stage=stage, process_set=mine, shard_size=shard_size
        )
        for step in range(STEPS):
            x, y = zc.local_batch(step, mine.rank(), mine.size())
            zc.loss_of(model, x, y).backward()
            opt.step()
            opt.zero_grad()
        out[("subset", stage, shard_size)] = (
            zc.max_rel_diff(hvd.full_state_dict(model), refs["adamw"]),
            None,
            None,
        )
    return out


def _equivalence(configs):
    import hvdlite.torch as hvd

    hvd.init()
    out = {}
    refs = {kind: zc.reference(kind, STEPS) for kind in ("sgd", "adamw")}
    for stage, shard_size, kind in configs:
        bucket = 200 if stage < 3 and kind == "sgd" else None  # several buckets, split params
        full, live = _train(stage, shard_size, kind, bucket_numel=bucket)
        out[(stage, shard_size, kind)] = (zc.max_rel_diff(full, refs[kind]), _np(full), _np(live))
    if hvd.size() == 4:
        out.update(_subsets(refs))
    hvd.shutdown()
    return out


@pytest.mark.parametrize(
    "size", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]
)
def test_equivalence_with_one_process(size):
    configs = _configs(size)
    results = run_pooled(_equivalence, size, args=(configs,), timeout=120)
    for r in range(size):
        for cfg, (rel, _, _) in results[r].items():
            assert rel <= 1e-6, "%s on %d ranks, rank %d: max relative difference %.3g" % (cfg, size, r, rel)
    for cfg in configs:
        rel, full0, live0 = results[0][cfg]
        assert rel <= 1e-6, "%s on %d ranks: max relative difference %.3g" % (cfg, size, rel)
        for r in range(1, size):
            _, full, live = results[r][cfg]
            for k in full0:
                assert np.array_equal(full[k], full0[k]), "%s: rank %d differs from rank 0 in %s" % (
                    cfg,
                    r,
                    k,
                )
            if live0 is not None:
                for k in live0:
                    assert np.array_equal(live[k], live0[k]), "%s: rank %d's live %s differs" % (cfg, r, k)


def _clip_and_accumulate():

    ref = zc.reference("sgd", STEPS, clip=0.5)
    out = {}
    for stage in (1, 2, 3):
        full, _ = _train(stage, None, "sgd", clip=0.5)
        out[("clip", stage)] = zc.max_rel_diff(full, ref)
        full, _ = _train(stage, None, "sgd", clip=0.5, passes=2)
        out[("accumulate", stage)] = zc.max_rel_diff(full, ref)
    return out


def _mixed():
    """bf16 compute parameters, fp32 masters: close to fp32 training, identical on all ranks."""
    ref = zc.reference("adamw", STEPS)
    out = {}
    for stage in (1, 2, 3):
        full, live = _train(stage, None, "adamw", mixed=torch.bfloat16)
        dtypes = {str(v.dtype) for v in (live or {}).values()}
        out[stage] = (zc.max_rel_diff(full, ref), {str(v.dtype) for v in full.values()}, dtypes, _np(full))
    return out


def _errors():
    import hvdlite.torch as hvd

    model = zc.make_model()
    messages = []
    rejected = [torch.optim.LBFGS(model.parameters())]
    if hasattr(torch.optim, "Adafactor"):
        rejected.append(torch.optim.Adafactor(model.parameters()))
    for opt in rejected:
        try:
            hvd.ZeroOptimizer(opt, model)
        except hvd.InvalidArgumentError as e:  # a ValueError
            messages.append(str(e))
    other = torch.nn.Linear(2, 2)
    try:
        hvd.ZeroOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), model)
    except ValueError as e:
        messages.append(str(e))
    try:
        hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, shard_size=3)
    except ValueError as e:
        messages.append(str(e))
    fresh = zc.make_model()
    opt = hvd.ZeroOptimizer(_Factored(fresh.parameters()), fresh)
    x, y = zc.local_batch(0, hvd.rank(), hvd.size())
    zc.loss_of(fresh, x, y).backward()
    try:
        opt.step()  # its state is checked after the first step
    except ValueError as e:
        messages.append(str(e))
    return messages


class _Factored(torch.optim.Optimizer):
    """Adafactor-like: keeps a state tensor shaped unlike its parameter."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["row"] = p.grad.reshape(-1)[:1].abs() + p.grad.abs().mean().reshape(
                        1
                    ).repeat(2)
                    p.add_(p.grad, alpha=-group["lr"])


def _clip_accumulate_errors():
    import hvdlite.torch as hvd

    hvd.init()
    out = (_clip_and_accumulate(), _errors(), _mixed())
    hvd.shutdown()
    return out


def test_clip_accumulation_mixed_precision_and_errors():
    results = run_pooled(_clip_accumulate_errors, 2, timeout=90)
    for stage, (rel, full_dtypes, live_dtypes, full) in results[0][2].items():
        assert rel <= 3e-2, (stage, rel)  # bf16 forward/backward: close, not equal
        assert full_dtypes == {"torch.float32"} and live_dtypes <= {"torch.bfloat16"}, stage
        other = results[1][2][stage][3]
        assert all(np.array_equal(full[k], other[k]) for k in full), stage
    for rels, messages, _ in results:
        for key, rel in rels.items():
            assert rel <= 1e-5, "%s: max relative difference %.3g" % (key, rel)
        has_adafactor = hasattr(torch.optim, "Adafactor")
        assert len(messages) == 4 + has_adafactor, messages
        assert "LBFGS" in messages[0] and "not elementwise" in messages[0]
        if has_adafactor:
            assert "Adafactor" in messages.pop(1)
        assert "not parameters of the model" in messages[1]
        assert "shard_size=3" in messages[2]
        assert "_Factored keeps state 'row' of shape (2,)" in messages[3]
