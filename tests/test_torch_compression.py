"""The stateful compressors (Compression.powersgd, .topk, .sign) and .bf16 in
DistributedOptimizer on 2 real ranks: training reaches a loss close to uncompressed
training, replicas stay bitwise identical, error feedback keeps exactly what was not
sent, the sparse and 1-bit compressors submit fewer bytes, and residuals survive
state_dict / load_state_dict, hvd.elastic.TorchState and broadcast_optimizer_state."""

import copy

import numpy as np
import pytest
import torch
from helpers import run_pooled

# min_numel small enough that the test model's two weight matrices are compressed.
_FACTORIES = {
    "none": lambda hvd: hvd.Compression.none,
    "bf16": lambda hvd: hvd.Compression.bf16,
    "powersgd": lambda hvd: hvd.Compression.powersgd(rank=2, start_step=3, min_numel=256),
    "topk": lambda hvd: hvd.Compression.topk(ratio=0.1, min_numel=256),
    "topk_dgc": lambda hvd: hvd.Compression.topk(ratio=0.1, momentum=0.9, min_numel=256),
    "topk_fused": lambda hvd: hvd.Compression.topk(ratio=0.1, min_numel=256, fused=True),
    "sign": lambda hvd: hvd.Compression.sign(min_numel=256),
}


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 16, generator=g)
    teacher = torch.randn(16, 4, generator=g)
    return x, torch.tanh(x @ teacher)


def _model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def _optimizer(hvd, model, compression, momentum=0.9):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression)


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def _train(kind, steps):
    """Trains on this rank's half of the data; returns (full-data loss, params, bytes)."""
    import hvdlite.torch as hvd

    hvd.init()
    model = _model()
    x, y = _data()
    compression = _FACTORIES[kind](hvd)
    # DGC's momentum correction replaces the optimizer's momentum.
    opt = _optimizer(hvd, model, compression, momentum=0.0 if kind == "topk_dgc" else 0.9)
    shard = slice(hvd.rank(), None, hvd.size())
    for _ in range(steps):
        _step(model, opt, x[shard], y[shard])
    with torch.no_grad():
        loss = float(torch.nn.functional.mse_loss(model(x), y))
    params = [p.detach().numpy().copy() for p in model.parameters()]
    sent = (compression.bytes_submitted, compression.bytes_uncompressed) if kind in _STATEFUL else None
    return loss, params, sent


_STATEFUL = ("powersgd", "topk", "topk_dgc", "topk_fused", "sign")


def _train_all(steps):
    return {kind: _train(kind, steps) for kind in _FACTORIES}


@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_each_compressor_trains_close_to_uncompressed_with_identical_replicas(size):
    results = run_pooled(_train_all, size, args=(100,), timeout=120)
    with torch.no_grad():
        initial = float(torch.nn.functional.mse_loss(_model()(_data()[0]), _data()[1]))
    baseline = results[0]["none"][0]
    for kind in _FACTORIES:
        loss, params, sent = results[0][kind]
        for other in results[1:]:
            assert loss == other[kind][0], kind
            for mine, theirs in zip(params, other[kind][1]):
                assert np.array_equal(mine, theirs), "%s: replicas differ" % kind
        assert loss < 0.2 * initial, (kind, loss, initial)
        # DGC's momentum masking restarts the momentum of every entry it sends, so with 10% of
        # the entries sent per step it trails plain SGD with momentum on this small model.
        assert loss < (2.5 if kind == "topk_dgc" else 1.4) * baseline, (kind, loss, baseline)
        if kind in _STATEFUL:  # submitted against the float32 allreduce (biases uncompressed)
            submitted, uncompressed = sent
            assert submitted * {"powersgd": 2, "sign": 10}.get(kind, 4) < uncompressed, (kind, sent)


def _one_step_feedback(kind, mode="average"):
    """One compressed step from zero residuals: every rank's gradient, residual and output.
    mode "sum": op=Sum; "accumulate": backward_passes_per_step=2, one pass per half batch."""
    import hvdlite.torch as hvd

    hvd.init()
    model = _model()
    x, y = _data()
    compression = _FACTORIES[kind](hvd)
    if kind == "powersgd":
        compression.start_step = 0
    shard = slice(hvd.rank(), None, hvd.size())
    passes = (
        [x[shard], y[shard]]
        if mode != "accumulate"
        else [x[shard][:32], y[shard][:32], x[shard][32:], y[shard][32:]]
    )
    reference = copy.deepcopy(model)  # this rank's gradient, away from the in-place allreduces
    for i in range(0, len(passes), 2):
        torch.nn.functional.mse_loss(reference(passes[i]), passes[i + 1]).backward()
    grads = {n: p.grad for n, p in reference.named_parameters()}
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Sum if mode == "sum" else hvd.Average,
        backward_passes_per_step=2 if mode == "accumulate" else 1,
    )
    opt.zero_grad()
    for i in range(0, len(passes), 2):
        torch.nn.functional.mse_loss(model(passes[i]), passes[i + 1]).backward()
    opt.synchronize()
    out = {}
    for n, p in model.named_parameters():
        residual = compression.residual(n)
        gathered = hvd.allgather(torch.stack([grads[n], residual if residual is not None else 0 * grads[n]]))
        out[n] = (gathered.numpy(), p.grad.numpy().copy(), compression.plans[n].method)
    with opt.skip_synchronize():
        opt.step()
    return out


def test_error_feedback_keeps_exactly_what_was_not_sent():
    for kind, mode in [
        ("powersgd", "average"),
        ("topk", "average"),
        ("topk_fused", "average"),
        ("sign", "average"),
        ("sign", "sum"),
        ("powersgd", "accumulate"),
    ]:
        results = run_pooled(_one_step_feedback, 2, args=(kind, mode), timeout=60)
        assert results[0].keys() == results[1].keys()
        methods, sent_counts = set(), {}
        for name, (gathered, output, method) in results[0].items():
            methods.add(method)
            assert np.array_equal(output, results[1][name][1]), (kind, name)
            grad_sum = gathered[0] + gathered[2]
            residual_sum = gathered[1] + gathered[3]
            # sum of residuals + size x averaged output (op=Sum: + the summed output) == sum of gradients
            times = 1 if mode == "sum" else 2
            np.testing.assert_allclose(residual_sum + times * output, grad_sum, rtol=1e-5, atol=1e-6)
            if method == "none":
                assert not residual_sum.any()
            if kind.startswith("topk") and method == "topk":
                for g, r in ((gathered[0], gathered[1]), (gathered[2], gathered[3])):
                    sent = r == 0
                    assert np.array_equal(r[~sent], g[~sent])  # unsent entries kept exactly
                    assert not (g == 0).any()
                    sent_counts.setdefault(name, []).append(int(sent.sum()))
        assert methods == {"none", kind.split("_")[0]}, (kind, methods)  # biases uncompressed
        if kind == "topk":
            assert sent_counts == {"0.weight": [102, 102], "2.weight": [25, 25]}, sent_counts  # 10% each
        if kind == "topk_fused":  # 10% of the 1024 + 256 entries of both weights, chosen together
            assert [sum(c) for c in zip(*sent_counts.values())] == [128, 128], sent_counts


def _state_round_trip(kind):
    import hvdlite.torch as hvd

    hvd.init()
    x, y = _data()
    shard = slice(hvd.rank(), None, hvd.size())
    model = _model()
    compression = _FACTORIES[kind](hvd)
    opt = _optimizer(hvd, model, compression)
    for _ in range(5):
        _step(model, opt, x[shard], y[shard])
    saved_state = copy.deepcopy(opt.state_dict())
    saved_model = copy.deepcopy(model.state_dict())
    names = sorted(n for n in compression.plans if compression.residual(n) is not None)
    out = {"names": names}
    # A fresh optimizer (new compressor) loaded from the checkpoint continues identically.
    twin_model = _model(seed=7)
    twin_model.load_state_dict(saved_model)
    twin_compression = _FACTORIES[kind](hvd)
    twin = _optimizer(hvd, twin_model, twin_compression)
    twin.load_state_dict(saved_state)
    out["restored"] = all(torch.equal(twin_compression.residual(n), compression.residual(n)) for n in names)
    _step(model, opt, x[shard], y[shard])
    _step(twin_model, twin, x[shard], y[shard])
    out["continued"] = all(torch.equal(a, b) for a, b in zip(model.parameters(), twin_model.parameters()))
    # TorchState: save, step, restore brings the residuals back.
    state = hvd.elastic.TorchState(model, opt)
    before = {n: compression.residual(n).clone() for n in names}
    _step(model, opt, x[shard], y[shard])
    out["moved"] = any(not torch.equal(before[n], compression.residual(n)) for n in names)
    state.restore()
    out["elastic_restored"] = all(torch.equal(before[n], compression.residual(n)) for n in names)
    # sync (broadcast_optimizer_state): residuals stay each rank's own.
    state.sync()
    out["kept_after_sync"] = all(torch.equal(before[n], compression.residual(n)) for n in names)
    out["residual_sum"] = float(sum(compression.residual(n).sum() for n in names))
    # state_dict() hands out snapshots: later steps never overwrite those tensors in place...
    handed = compression.state_dict()["local"]
    kept = {n: handed[n]["residual"].clone() for n in names}
    _step(model, opt, x[shard], y[shard])
    out["snapshot_kept"] = all(torch.equal(kept[n], handed[n]["residual"]) for n in names)
    # ...while sign, between such calls, reuses its own residual's memory step after step.
    at = {n: compression.residual(n).data_ptr() for n in names}
    _step(model, opt, x[shard], y[shard])
    out["reused"] = all(compression.residual(n).data_ptr() == at[n] for n in names)
    return out


@pytest.mark.parametrize("kind", ["powersgd", "topk_dgc", "topk_fused", "sign"])
def test_residuals_are_state(kind):
    results = run_pooled(_state_round_trip, 2, args=(kind,), timeout=60)
    for out in results:
        assert out["names"], kind
        assert out["restored"] and out["continued"], out
        assert out["moved"] and out["elastic_restored"] and out["kept_after_sync"], out
        assert out["snapshot_kept"] and out["reused"] == (kind == "sign"), out
    assert results[0]["residual_sum"] != results[1]["residual_sum"]  # per rank, not broadcast


def _misuse():
    import hvdlite.torch as hvd

    hvd.init()
    model = _model()
    errors = {}
    for label, call in {
        "allreduce": lambda: hvd.allreduce(torch.ones(3), compression=hvd.Compression.topk()),
        "groups": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.sign(),
            groups=1,
        ),
        "op": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.powersgd(),
            op=hvd.Max,
        ),
        "ratio": lambda: hvd.Compression.topk(ratio=0.0),
        "rank": lambda: hvd.Compression.powersgd(rank=0),
    }.items():
        try:
            call()
            errors[label] = None
        except Exception as e:
            errors[label] = (type(e).__name__, str(e))
    return errors


def test_misuse_fails_with_a_clear_error():
    errors = run_pooled(_misuse, 2, timeout=60)[0]
    assert errors["allreduce"][0] == "NotSupportedError" and "DistributedOptimizer" in errors["allreduce"][1]
    assert errors["groups"][0] == "NotSupportedError" and "groups=" in errors["groups"][1]
    assert errors["op"][0] == "NotSupportedError" and "Average or Sum" in errors["op"][1]
    assert errors["ratio"][0] == "InvalidArgumentError" and "ratio" in errors["ratio"][1]
    assert errors["rank"][0] == "InvalidArgumentError" and "rank" in errors["rank"][1]


def test_bit_packing_and_sampled_top_k_single_process():
    from hvdlite.torch import sign_compressor as sc
    from hvdlite.torch import sparse_compressors

    g = torch.Generator().manual_seed(3)
    for n in (1, 7, 8, 9, 1000, 4099):
        bits = torch.rand(n, generator=g) > 0.5
        nbytes = 4 * (-(-n // 32))
        packed = sc.pack_bits(bits, nbytes)
        # the NumPy path (CPU) and the torch path (other devices) agree, and round-trip
        assert packed.dtype == torch.uint8 and packed.numel() == nbytes
        assert torch.equal(packed, sc._pack_bits_torch(bits, nbytes))
        assert torch.equal(sc.unpack_bits(packed, n).bool(), bits)
        assert torch.equal(sc._unpack_bits_torch(packed, n).bool(), bits)
        # sign bits (-0.0 negative) and the +-1.0 they decode to, as copysign reads the sign
        values = torch.randn(n, generator=g)
        values[::3] = 0.0
        values[1::5] = -0.0
        sign_packed = sc.sign_bits(values, nbytes)
        assert torch.equal(sign_packed, sc.pack_bits(torch.signbit(values), nbytes))
        signs = sc.signs_of_bits(sign_packed, n)
        assert torch.equal(signs, torch.copysign(torch.ones(n), values))
        assert torch.equal(sc._signs_of_bits_torch(sign_packed, n), signs)
    magnitude = torch.randn(200_000, generator=g).abs()
    for k in (1, 50, 2000):
        chosen = sparse_compressors.select_topk(magnitude, k, g)
        assert chosen.numel() == k and chosen.unique().numel() == k
        assert magnitude[chosen].min() >= torch.topk(magnitude, k).values.min()


def test_fused_sign_loops_match_the_reference_bit_for_bit():
    """The core's fused encode (gradient + residual, the chunk scales, the bits and the new
    residual in one pass) and decode (scales x signs written or added) against the
    torch/NumPy reference: same bytes, same float bits, -0.0 and all-zero chunks included,
    odd and short last chunks, n not a multiple of 8; the residual added in place, into a
    new tensor, absent (first step), or already added (x given)."""
    from hvdlite.torch import sign_compressor as sc

    g = torch.Generator().manual_seed(5)
    for n, chunk in ((1, 1), (13, 4), (1000, 96), (4099, 512), (777, 7), (700, 70)):
        nbytes, chunks = 4 * (-(-n // 32)), -(-n // chunk)
        for mode in ("in place", "new tensor", "first step", "added"):
            grad = torch.randn(n, generator=g) * 3
            grad[::7] = 0.0
            grad[1::5] = -0.0
            residual = torch.randn(n, generator=g) * 0.1
            if mode == "first step":
                residual = None
            else:
                residual[: min(n, chunk)] = 0.0
            grad[: min(n, chunk)] = -0.0  # a chunk of zeros only (with its residual): scale 0
            corrected = grad.clone() if residual is None else torch.add(residual, grad)
            scales = sc.chunk_abs_means(corrected, chunk)
            means = torch.cat([v.abs().mean(1) for v in sc._chunk_views(corrected, chunk)])
            torch.testing.assert_close(scales, means, rtol=1e-6, atol=0)  # a mean, summed pairwise
            ref_x = corrected.clone()
            ref_bits, ref_decoder = sc._reference_encode(ref_x, chunk, scales, nbytes)
            fused_bits = torch.full((nbytes,), 0xFF, dtype=torch.uint8)  # padding must be zeroed
            fused_scales = torch.empty(chunks)
            x = {"in place": residual, "added": corrected.clone()}.get(mode, torch.empty(n))
            grad_at = 0 if mode == "added" else grad.data_ptr()
            residual_at = 0 if residual is None or mode == "added" else residual.data_ptr()
            ptrs = (fused_scales.data_ptr(), fused_bits.data_ptr())
            sc.core.sign_encode(grad_at, residual_at, x.data_ptr(), n, chunk, *ptrs, nbytes)
            assert torch.equal(fused_scales.view(torch.int32), scales.view(torch.int32)), (n, chunk, mode)
            assert torch.equal(fused_bits, ref_bits), (n, chunk, mode)
            assert torch.equal(x.view(torch.int32), ref_x.view(torch.int32)), (n, chunk, mode)
        decoder = sc._fused_decoder(n, chunk)
        base = torch.randn(n, generator=g)
        for accumulate in (False, True):
            ref = ref_decoder(ref_bits, scales * 0.5, base.clone() if accumulate else None, accumulate)
            got = decoder(fused_bits, scales * 0.5, base.clone() if accumulate else None, accumulate)
            assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
        # 3 ranks' segments in one call: the sum in rank order, as 3 reference decodes give it
        segments = [(ref_bits, scales), (fused_bits.flip(0), scales * 3), (ref_bits, -scales)]
        ref = None
        for rank, (bits, rank_scales) in enumerate(segments):
            ref = ref_decoder(bits, rank_scales, ref, rank > 0)
        got = torch.empty(n)
        sc.core.sign_decode(
            [b.data_ptr() for b, _ in segments],
            [s.data_ptr() for _, s in segments],
            n,
            chunk,
            got.data_ptr(),
            False,
        )
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
        strided = torch.zeros(2 * n)[::2]  # not contiguous: decoded apart, then added
        assert torch.equal(
            decoder(fused_bits, scales, strided, False), ref_decoder(ref_bits, scales, None, False)
        )
