"""hvd.DiLoCo on 2 real ranks: with outer_lr=1, outer_momentum=0 a sync makes the
weights exactly the average of the ranks' weights (local SGD); with the outer Nesterov
step, the weights after a sync are the outer step on the averaged delta, every replica
holds the same bits, and training converges; state_dict round-trips."""

import copy

import numpy as np
import torch
from helpers import run_pooled


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 16, generator=g)
    teacher = torch.randn(16, 4, generator=g)
    return x, torch.tanh(x @ teacher)


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def _local_step(model, lr, x, y):
    """The inner step DiLoCo's inner SGD takes, on a copy."""
    twin = copy.deepcopy(model)
    _loss(twin, x, y).backward()
    with torch.no_grad():
        for p in twin.parameters():
            p.sub_(p.grad, alpha=lr)
    return twin


def _sync_math(outer_lr, outer_momentum):
    """Two syncs of sync_every=2; returns what each sync produced and what it should have."""
    import hvdlite.torch as hvd

    hvd.init()
    model = _model(seed=1 + hvd.rank())  # DiLoCo broadcasts rank 0's weights
    x, y = _data()
    shard = slice(hvd.rank(), None, hvd.size())
    opt = hvd.DiLoCo(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        sync_every=2,
        outer_lr=outer_lr,
        outer_momentum=outer_momentum,
    )
    outer = [p.detach().clone() for p in model.parameters()]
    momentum = [torch.zeros_like(p) for p in outer]
    out = {"checks": []}
    for step in range(4):
        local = _local_step(model, 0.1, x[shard], y[shard]) if step % 2 == 1 else None
        opt.zero_grad()
        _loss(model, x[shard], y[shard]).backward()
        opt.step()
        if local is None:
            continue
        gathered = [hvd.allgather(p.detach().unsqueeze(0)) for p in local.parameters()]
        if outer_lr == 1.0 and outer_momentum == 0.0:
            expected = [(g[0] + g[1]) / 2 for g in gathered]
        else:
            expected = []
            for i, g in enumerate(gathered):
                delta = ((outer[i] - g[0]) + (outer[i] - g[1])) / 2
                momentum[i] = outer_momentum * momentum[i] + delta
                expected.append(outer[i] - outer_lr * (delta + outer_momentum * momentum[i]))
            outer = expected
        actual = [p.detach().clone() for p in model.parameters()]
        out["checks"].append([(a.numpy(), e.numpy()) for a, e in zip(actual, expected)])
    out["params"] = [p.detach().numpy().copy() for p in model.parameters()]
    return out


def test_local_sgd_is_exactly_the_average():
    results = run_pooled(_sync_math, 2, args=(1.0, 0.0), timeout=60)
    for out in results:
        assert len(out["checks"]) == 2
        for check in out["checks"]:
            for actual, expected in check:
                assert np.array_equal(actual, expected)
    for mine, theirs in zip(results[0]["params"], results[1]["params"]):
        assert np.array_equal(mine, theirs)


def test_outer_nesterov_step_on_the_averaged_delta():
    results = run_pooled(_sync_math, 2, args=(0.7, 0.9), timeout=60)
    for out in results:
        for check in out["checks"]:
            for actual, expected in check:
                np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(results[0]["params"], results[1]["params"]):
        assert np.array_equal(mine, theirs)


def _train(sync_every, steps):
    import hvdlite.torch as hvd

    hvd.init()
    model = _model(seed=1)
    x, y = _data()
    shard = slice(hvd.rank(), None, hvd.size())
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DiLoCo(model, inner, sync_every=sync_every)
    differed = False
    for step in range(steps):
        opt.zero_grad()
        _loss(model, x[shard], y[shard]).backward()
        opt.step()
        if step == 0:
            mine = model[0].weight.detach().clone()
            theirs = hvd.allgather(mine.unsqueeze(0))[1 - hvd.rank()]
            differed = not torch.equal(mine, theirs)
    saved = copy.deepcopy(opt.state_dict())
    twin_model = copy.deepcopy(model)
    twin = hvd.DiLoCo(
        twin_model,
        torch.optim.SGD(twin_model.parameters(), lr=0.1, momentum=0.9),
        sync_every=sync_every,
        name="twin",
    )
    twin.load_state_dict(saved)
    for m, o in ((model, opt), (twin_model, twin)):
        for _ in range(sync_every):
            o.zero_grad()
            _loss(m, x[shard], y[shard]).backward()
            o.step()
    with torch.no_grad():
        loss = float(_loss(model, x, y))
    same = all(torch.equal(a, b) for a, b in zip(model.parameters(), twin_model.parameters()))
    return loss, differed, same, [p.detach().numpy().copy() for p in model.parameters()], opt.syncs


def test_diloco_trains_with_identical_replicas_after_each_sync():
    with torch.no_grad():
        initial = float(_loss(_model(seed=1), *_data()))
    results = run_pooled(_train, 2, args=(8, 96), timeout=60)
    for loss, differed, same, _, syncs in results:
        assert differed  # between syncs the ranks really step alone
        assert same  # state_dict round trip continues identically
        assert syncs == 13
        assert loss < 0.2 * initial, (loss, initial)
    for mine, theirs in zip(results[0][3], results[1][3]):
        assert np.array_equal(mine, theirs)


def _elastic_state():
    import hvdlite.torch as hvd

    hvd.init()
    model = _model(seed=1)
    x, y = _data()
    shard = slice(hvd.rank(), None, hvd.size())
    opt = hvd.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), sync_every=2)

    def step():
        opt.zero_grad()
        _loss(model, x[shard], y[shard]).backward()
        opt.step()

    for _ in range(4):
        step()
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=4)
    saved = copy.deepcopy(opt.state_dict())
    for _ in range(3):
        step()
    state.restore()
    restored = opt.state_dict()
    same = all(
        torch.equal(a, b)
        for a, b in zip(saved["outer"] + saved["momentum"], restored["outer"] + restored["momentum"])
    )
    if hvd.rank() == 1:  # as if this rank had joined late: sync gives it rank 0's state
        opt.inner_steps, opt._outer[0] = 0, torch.zeros_like(opt._outer[0])
    state.sync()
    step()
    step()  # a sync: every replica must hold the same weights
    return same, opt.inner_steps, [p.detach().numpy().copy() for p in model.parameters()]


def test_diloco_state_travels_with_torch_state():
    results = run_pooled(_elastic_state, 2, timeout=60)
    for same, inner_steps, _ in results:
        assert same and inner_steps == 6
    for mine, theirs in zip(results[0][2], results[1][2]):
        assert np.array_equal(mine, theirs)


def _overlap():
    """sync_every=2, overlap: the sync begun by step 2 lands in step 3, on top of step 3's
    inner step; returns (weights, expected) after step 3, outer weights, final weights."""
    import hvdlite.torch as hvd

    hvd.init()
    model = _model(seed=1)
    x, y = _data()
    shard = slice(hvd.rank(), None, hvd.size())
    opt = hvd.DiLoCo(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        sync_every=2,
        outer_lr=1.0,
        outer_momentum=0.0,
        overlap=True,
    )
    snapshot = None
    for step in range(3):
        local = _local_step(model, 0.1, x[shard], y[shard])
        opt.zero_grad()
        _loss(model, x[shard], y[shard]).backward()
        opt.step()
        if step == 1:
            snapshot = [p.detach().clone() for p in local.parameters()]
            pending = opt._pending is not None
    gathered = [hvd.allgather(s.unsqueeze(0)) for s in snapshot]
    expected = [
        (g[0] + g[1]) / 2 + (q.detach() - s) for g, q, s in zip(gathered, local.parameters(), snapshot)
    ]
    after = [(p.detach().numpy().copy(), e.numpy()) for p, e in zip(model.parameters(), expected)]
    outer = [o.numpy().copy() for o in opt.outer_weights().values()]
    opt.synchronize()
    return pending, after, outer, [p.detach().numpy().copy() for p in model.parameters()], opt.syncs


def test_overlap_lands_the_sync_one_step_later():
    results = run_pooled(_overlap, 2, timeout=60)
    for pending, after, _, _, syncs in results:
        assert pending and syncs == 2
        for actual, expected in after:
            np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(results[0][1], results[1][1]))
    for mine, theirs in zip(results[0][2], results[1][2]):
        assert np.array_equal(mine, theirs)  # the outer weights are shared
    for mine, theirs in zip(results[0][3], results[1][3]):
        assert np.array_equal(mine, theirs)  # synchronize() makes the weights equal


def _misuse():
    import hvdlite.torch as hvd

    hvd.init()
    model = _model(seed=1)
    errors = {}
    for label, call in {
        "distributed": lambda: hvd.DiLoCo(
            model, hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        ),
        "sync_every": lambda: hvd.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=0),
    }.items():
        try:
            call()
            errors[label] = None
        except Exception as e:
            errors[label] = (type(e).__name__, str(e))
    return errors


def test_diloco_misuse_fails_with_a_clear_error():
    errors = run_pooled(_misuse, 2, timeout=60)[0]
    assert (
        errors["distributed"][0] == "InvalidArgumentError"
        and "plain torch optimizer" in errors["distributed"][1]
    )
    assert errors["sync_every"][0] == "InvalidArgumentError" and "sync_every" in errors["sync_every"][1]
