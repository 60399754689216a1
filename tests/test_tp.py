"""Tensor parallelism (hvd.parallel) against the dense modules on tp=2 and tp=3 real ranks:
outputs and gradients equal the dense module's to fp32 rounding (sizes chosen not to divide
by 3), and replicated results are bitwise identical on every member."""

import numpy as np
import pytest
from helpers import run_pooled

RTOL, ATOL = 1e-5, 1e-6


def _dense_models():
    import torch
    from torch import nn

    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(8, 10), nn.Linear(10, 8)
    emb, head = nn.Embedding(11, 8), nn.Linear(8, 11)
    ln = nn.LayerNorm(8)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    x = torch.randn(5, 3, 8)  # [sequence, batch, hidden]
    ids = torch.randint(0, 11, (5, 3))
    target = torch.randint(0, 11, (5, 3))
    target[0, 0] = -100  # one ignored token
    probe = torch.randn(5, 3, 8)
    return fc1, fc2, emb, head, ln, x, ids, target, probe


def _np(t):
    return t.detach().numpy().copy()


def _mlp(hvd, fc1, fc2, x, probe, out):
    import torch
    import torch.nn.functional as F

    P = hvd.parallel
    col, row = P.ColumnParallelLinear.from_dense(fc1), P.RowParallelLinear.from_dense(fc2)
    xi = x.clone().requires_grad_()
    y = row(F.gelu(col(xi)))
    (y * probe).sum().backward()
    out["mlp"] = {
        "y": _np(y),
        "x.grad": _np(xi.grad),
        "col.w.grad": _np(col.weight.grad),
        "col.b.grad": _np(col.bias.grad),
        "row.w.grad": _np(row.weight.grad),
        "row.b.grad": _np(row.bias.grad),
        "slices": (col.start, row.start),
    }
    full_w = col.full_weight()[0]
    out["roundtrip"] = bool(
        torch.equal(full_w, fc1.weight) and torch.equal(row.to_dense().weight, fc2.weight)
    )
    gathered = P.ColumnParallelLinear.from_dense(fc1, gather_output=True)
    out["gathered"] = _np(gathered(x))


def _sequence_parallel(hvd, fc1, fc2, ln, x, probe, out):
    import torch.nn.functional as F

    from hvdlite.torch.conjugate import partition

    P = hvd.parallel
    k, i = hvd.size(), hvd.rank()
    s0, n = partition(x.shape[0], k, i)
    norm = P.SequenceParallelLayerNorm.from_dense(ln)
    col = P.ColumnParallelLinear.from_dense(fc1, sequence_parallel=True)
    row = P.RowParallelLinear.from_dense(fc2, sequence_parallel=True)
    xi = x[s0 : s0 + n].clone().requires_grad_()
    y = row(F.gelu(col(norm(xi))))
    (y * probe[s0 : s0 + n]).sum().backward()
    out["sp"] = {
        "y": _np(y),
        "x.grad": _np(xi.grad),
        "ln.w.grad": _np(norm.weight.grad),
        "ln.b.grad": _np(norm.bias.grad),
        "row.b.grad": _np(row.bias.grad),
        "col.w.grad": _np(col.weight.grad),
        "rows": (s0, n),
    }


def _vocab(hvd, emb, head, ids, target, out):
    P = hvd.parallel
    pemb = P.VocabParallelEmbedding.from_dense(emb)
    phead = P.ColumnParallelLinear.from_dense(head)
    logits = phead(pemb(ids))
    loss = P.vocab_parallel_cross_entropy(logits, target)
    loss.backward()
    from hvdlite.torch.conjugate import partition

    s0, n = partition(ids.shape[0], hvd.size(), hvd.rank())
    sp_emb = P.VocabParallelEmbedding.from_dense(emb, sequence_parallel=True)
    out["sp_emb"] = (_np(sp_emb(ids)), s0, n)
    out["vocab"] = {
        "loss": _np(loss),
        "emb.grad": _np(pemb.weight.grad),
        "head.grad": _np(phead.weight.grad),
        "starts": (pemb.start, phead.start),
        "emb_full": bool((pemb.to_dense().weight == emb.weight).all()),
    }


def _tp_body():
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    fc1, fc2, emb, head, ln, x, ids, target, probe = _dense_models()
    out: dict = {}
    _mlp(hvd, fc1, fc2, x, probe, out)
    _sequence_parallel(hvd, fc1, fc2, ln, x, probe, out)
    _vocab(hvd, emb, head, ids, target, out)
    hvd.shutdown()
    return out


def _grads(fc1, fc2):
    return {
        "fc1.w": _np(fc1.weight.grad),
        "fc1.b": _np(fc1.bias.grad),
        "fc2.w": _np(fc2.weight.grad),
        "fc2.b": _np(fc2.bias.grad),
    }


def _reference():
    import torch.nn.functional as F

    fc1, fc2, emb, head, ln, x, ids, target, probe = _dense_models()
    ref = {}
    xi = x.clone().requires_grad_()
    y = fc2(F.gelu(fc1(xi)))
    (y * probe).sum().backward()
    ref["mlp"] = {"y": _np(y), "x.grad": _np(xi.grad), "gathered": _np(fc1(x)), **_grads(fc1, fc2)}
    for m in (fc1, fc2):
        m.zero_grad()
    xi = x.clone().requires_grad_()
    y = fc2(F.gelu(fc1(ln(xi))))
    (y * probe).sum().backward()
    ref["sp"] = {"y": _np(y), "x.grad": _np(xi.grad), "ln.w": _np(ln.weight.grad), "ln.b": _np(ln.bias.grad)}
    ref["sp"].update(_grads(fc1, fc2))
    ref["emb_out"] = _np(emb(ids))
    loss = F.cross_entropy(head(emb(ids)).reshape(-1, 11), target.reshape(-1), ignore_index=-100)
    loss.backward()
    ref["vocab"] = {"loss": _np(loss), "emb": _np(emb.weight.grad), "head": _np(head.weight.grad)}
    return ref


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("tp", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_tensor_parallel_equals_dense(tp):
    import torch

    torch.set_num_threads(1)
    outs = run_pooled(_tp_body, tp, timeout=120)
    ref = _reference()
    m = ref["mlp"]
    for out in outs:
        got = out["mlp"]
        c0, r0 = got["slices"]
        nc, nr = got["col.w.grad"].shape[0], got["row.w.grad"].shape[1]
        _close(got["y"], m["y"])
        _close(got["x.grad"], m["x.grad"])
        _close(got["col.w.grad"], m["fc1.w"][c0 : c0 + nc])
        _close(got["col.b.grad"], m["fc1.b"][c0 : c0 + nc])
        _close(got["row.w.grad"], m["fc2.w"][:, r0 : r0 + nr])
        _close(got["row.b.grad"], m["fc2.b"])
        _close(out["gathered"], m["gathered"])
        assert out["roundtrip"]
    assert sum(o["mlp"]["col.w.grad"].shape[0] for o in outs) == 10
    # replicated results are the same bits on every member
    for key in ("y", "x.grad", "row.b.grad"):
        assert all(np.array_equal(o["mlp"][key], outs[0]["mlp"][key]) for o in outs), key
    assert all(np.array_equal(o["gathered"], outs[0]["gathered"]) for o in outs)

    s = ref["sp"]
    for out in outs:
        got = out["sp"]
        s0, n = got["rows"]
        c0 = out["mlp"]["slices"][0]
        _close(got["y"], s["y"][s0 : s0 + n])
        _close(got["x.grad"], s["x.grad"][s0 : s0 + n])
        _close(got["ln.w.grad"], s["ln.w"])
        _close(got["ln.b.grad"], s["ln.b"])
        _close(got["row.b.grad"], s["fc2.b"])
        _close(got["col.w.grad"], s["fc1.w"][c0 : c0 + got["col.w.grad"].shape[0]])
    for key in ("ln.w.grad", "row.b.grad"):
        assert all(np.array_equal(o["sp"][key], outs[0]["sp"][key]) for o in outs), key

    dense_emb = ref["emb_out"]
    for out in outs:
        got, s0, n = out["sp_emb"]
        _close(got, dense_emb[s0 : s0 + n])
    v = ref["vocab"]
    for out in outs:
        got = out["vocab"]
        e0, h0 = got["starts"]
        _close(got["loss"], v["loss"])
        _close(got["emb.grad"], v["emb"][e0 : e0 + got["emb.grad"].shape[0]])
        _close(got["head.grad"], v["head"][h0 : h0 + got["head.grad"].shape[0]])
        assert got["emb_full"]
    assert all(np.array_equal(o["vocab"]["loss"], outs[0]["vocab"]["loss"]) for o in outs)
