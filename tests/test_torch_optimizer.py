"""DistributedOptimizer on real processes: training replicas end bitwise
identical and match single-process training on the full batch; every mode
(backward_passes_per_step, groups, skip_synchronize, Sum / predivide, fp16,
sparse, Adasum) and Horovod's error cases."""

import warnings

import numpy as np
import torch
from helpers import run_pooled
from torch_wire import from_wire, to_wire


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 5, generator=g), torch.randn(16, 1, generator=g)


def _model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _train(hvd, steps=5, shard=True, **opt_kwargs):
    """SGD with momentum on this rank's shard; returns the final parameters."""
    model = _model()
    x, y = _data()
    if shard:
        x, y = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if hvd is not None:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **opt_kwargs)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _catch(fn):
    """(names of the exception's classes, message), or None. The names include the
    built-in Horovod raises (ValueError, AssertionError) and HvdliteError."""
    try:
        fn()
    except Exception as e:
        return [c.__name__ for c in type(e).__mro__], str(e)
    return None


def _accumulate_and_skip(hvd):
    model = _model()
    x, y = _data()
    out = {}
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=2,
    )
    for half in (x[:8], x[8:]):
        torch.nn.functional.mse_loss(model(half + hvd.rank()), y[:8]).backward()
    opt.step()
    out["accumulated"] = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    model2 = _model()
    plain = hvd.DistributedOptimizer(
        torch.optim.SGD(model2.parameters(), lr=0.1), named_parameters=model2.named_parameters()
    )
    torch.nn.functional.mse_loss(model2(x), y).backward()
    out["second_backward"] = _catch(lambda: torch.nn.functional.mse_loss(model2(x), y).backward())
    out["zero_grad_race"] = _catch(plain.zero_grad)
    plain.synchronize()
    torch.nn.utils.clip_grad_norm_(model2.parameters(), 0.5)
    with plain.skip_synchronize():
        plain.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain.zero_grad()
        torch.nn.functional.mse_loss(model2(x), y).backward()
        plain.synchronize()
        plain.step()
    out["warned"] = any("skip_synchronize" in str(w.message) for w in caught)
    return out


def _validation_errors(hvd):
    model = _model()
    params = list(model.named_parameters())
    sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
    return {
        "missing": _catch(lambda: hvd.DistributedOptimizer(sgd(), named_parameters=params[:1])),
        "duplicate": _catch(
            lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[("w", p) for _, p in params])
        ),
        "not_tuples": _catch(
            lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[p for _, p in params])
        ),
        "predivide": _catch(
            lambda: hvd.DistributedOptimizer(sgd(), op=hvd.Sum, gradient_predivide_factor=2.0)
        ),
        "bad_groups": _catch(lambda: hvd.DistributedOptimizer(sgd(), groups=-1)),
        "repeated_in_groups": _catch(
            lambda: hvd.DistributedOptimizer(sgd(), groups=[[params[0][1]], [params[0][1]]])
        ),
    }


def _sparse_and_unused(hvd):
    out = {}
    for as_dense in (False, True):
        emb = torch.nn.Embedding(6, 2, sparse=True)
        torch.nn.init.constant_(emb.weight, 1.0)
        unused = torch.nn.Parameter(torch.ones(2))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(list(emb.parameters()) + [unused], lr=1.0),
            named_parameters=[("emb", emb.weight), ("unused", unused)],
            sparse_as_dense=as_dense,
        )
        emb(torch.tensor([hvd.rank(), 5])).sum().backward()
        opt.step()
        out[as_dense] = (emb.weight.detach().clone(), unused.detach().clone())
    return out


def _optimizer_modes():
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    out = {
        "default": _train(hvd),
        "groups2": _train(hvd, groups=2),
        "num_groups": _train(hvd, num_groups=3),
        "groups_list": None,
        "fp16": _train(hvd, compression=hvd.Compression.fp16),
        "sum_predivide": _train(hvd, op=hvd.Average, gradient_predivide_factor=2.0),
        "sum": _train(hvd, op=hvd.Sum, steps=1),
        "adasum": _train(hvd, op=hvd.Adasum, steps=1),
        "adasum_grads": None,
    }
    model = _model()
    layers = list(model.parameters())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
        groups=[layers[:2], layers[3:]],
    )
    x, y = _data()
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[hvd.rank() :: 2]), y[hvd.rank() :: 2]).backward()
        opt.step()
    out["groups_list"] = [p.detach().clone() for p in model.parameters()]
    model = _model()
    x, y = _data()
    torch.nn.functional.mse_loss(model(x[hvd.rank() :: 2]), y[hvd.rank() :: 2]).backward()
    out["adasum_grads"] = [p.grad.clone() for p in model.parameters()]
    out.update(_accumulate_and_skip(hvd))
    out["errors"] = _validation_errors(hvd)
    out["sparse"] = _sparse_and_unused(hvd)
    hvd.shutdown()
    return to_wire(out)


def _adasum(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    dot = float(a @ b)
    return (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b


def test_optimizer_modes_on_two_ranks():
    results = from_wire(run_pooled(_optimizer_modes, 2, timeout=150))
    reference = _train(None, shard=False)
    for key in (
        "default",
        "groups2",
        "num_groups",
        "groups_list",
        "fp16",
        "sum_predivide",
        "sum",
        "adasum",
        "accumulated",
    ):
        for a, b in zip(results[0][key], results[1][key]):
            assert a.numpy().tobytes() == b.numpy().tobytes(), "replicas differ in mode %s" % key
    for key in ("default", "groups2", "num_groups", "groups_list", "sum_predivide"):
        for got, want in zip(results[0][key], reference):
            assert torch.allclose(got, want, atol=1e-5), key
    for got, want in zip(results[0]["fp16"], reference):
        assert torch.allclose(got, want, atol=5e-3)
    one_step = _train(None, shard=False, steps=1)
    start = _model()
    for got, want, p0 in zip(results[0]["sum"], one_step, start.parameters()):
        assert torch.allclose(got - p0.detach(), (want - p0.detach()) * 2, atol=1e-5)  # summed, not averaged
    for got, g0, g1, p0 in zip(
        results[0]["adasum"], results[0]["adasum_grads"], results[1]["adasum_grads"], start.parameters()
    ):
        delta = _adasum(-0.1 * g0, -0.1 * g1).reshape(p0.shape)
        assert torch.allclose(got.double(), p0.detach().double() + delta, atol=1e-6)
    for _r, res in enumerate(results):
        assert {"AssertionError", "HvdliteError"} <= set(
            res["second_backward"][0]
        ) and "backward_passes_per_step" in res["second_backward"][1]
        assert {"AssertionError", "HvdliteError"} <= set(res["zero_grad_race"][0]) and res["warned"]
        for key, err in res["errors"].items():
            assert err is not None and {"ValueError", "HvdliteError"} <= set(err[0]), key
        assert "duplicates" in res["errors"]["duplicate"][1] and "not named" in res["errors"]["missing"][1]
        for as_dense in (False, True):
            weight, unused = res["sparse"][as_dense]
            want = torch.ones(6, 2)
            for row in (0, 1):
                want[row] -= 0.5  # used by one rank: averaged gradient 1/2
            want[5] -= 1.0
            assert torch.allclose(weight, want), as_dense
            assert torch.equal(unused, torch.ones(2))
    np.testing.assert_array_equal(results[0]["accumulated"][0].numpy(), results[1]["accumulated"][0].numpy())
