"""hvdlite.torch's object, state and training helpers against Horovod 0.28.1 (see
test_parity_torch.py)."""

import pytest
import torch
from parity_torch import by_rank, covers, err, job_fixture

job = job_fixture(__name__)

# ---- objects, parameters, optimizer state ---------------------------------------------


@covers("broadcast_object", "allgather_object")
class TestObjects:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        obj = {"rank": r, "lambda": (lambda v: v + r) if r == 0 else None}
        got = hvd.broadcast_object(obj)  # default root 0
        return {
            "bcast": (got["rank"], got["lambda"](1)),
            "bcast_root1": hvd.broadcast_object([r], root_rank=1),
            "gathered": hvd.allgather_object({"r": r}),
        }

    def test_objects(self, job):
        for res in by_rank(job, type(self)):
            assert res["bcast"] == (0, 1)  # cloudpickle, as in Horovod: lambdas travel
            assert res["bcast_root1"] == [1]
            assert res["gathered"] == [{"r": 0}, {"r": 1}]


@covers("broadcast_parameters", "broadcast_optimizer_state")
class TestBroadcastState:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        torch.manual_seed(r)
        model = torch.nn.Linear(3, 2)
        hvd.broadcast_parameters(model.state_dict(), root_rank=1)
        from_state_dict = [p.detach().clone() for p in model.parameters()]
        torch.manual_seed(10 + r)
        model2 = torch.nn.Linear(3, 2)
        hvd.broadcast_parameters(model2.named_parameters(), root_rank=0)
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
        if r == 1:
            model(torch.ones(1, 3)).sum().backward()
            opt.step()  # only the root has state
        hvd.broadcast_optimizer_state(opt, root_rank=1)
        return {
            "params": from_state_dict,
            "params2": [p.detach().clone() for p in model2.parameters()],
            "lr": opt.param_groups[0]["lr"],
            "state_steps": sorted(float(s["step"]) for s in opt.state.values()),
            "bad_params": err(lambda: hvd.broadcast_parameters(torch.ones(1), 0)),
        }

    def test_every_rank_gets_the_roots_values(self, job):
        a, b = by_rank(job, type(self))
        assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
        assert all(torch.equal(x, y) for x, y in zip(a["params2"], b["params2"]))
        assert a["lr"] == b["lr"] == pytest.approx(0.02)
        assert a["state_steps"] == b["state_steps"] == [1.0, 1.0]

    def test_bad_params_is_a_value_error(self, job):
        # Horovod: ValueError('invalid params of type: ...')
        for res in by_rank(job, type(self)):
            assert "ValueError" in res["bad_params"][1]


@covers("Compression")
class TestCompression:
    def test_none_and_fp16(self):
        import hvdlite.torch as hvd

        x = torch.arange(4.0, dtype=torch.float32)
        c, ctx = hvd.Compression.none.compress(x)
        assert c is x and hvd.Compression.none.decompress(c, ctx) is x
        c, ctx = hvd.Compression.fp16.compress(x)
        assert c.dtype == torch.float16
        back = hvd.Compression.fp16.decompress(c, ctx)
        assert back.dtype == torch.float32 and torch.equal(back, x)
        ints = torch.arange(3)
        c, ctx = hvd.Compression.fp16.compress(ints)  # only floating point is compressed
        assert c.dtype == torch.int64 and hvd.Compression.fp16.decompress(c, ctx).dtype == torch.int64


@covers("DistributedOptimizer")
class TestDistributedOptimizer:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1, bias=False)
        base = torch.optim.SGD(model.parameters(), lr=1.0)
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
        before = model.weight.detach().clone()
        (model(torch.full((1, 2), float(r + 1)))).sum().backward()
        opt.step()
        out = {
            "isinstance": isinstance(opt, torch.optim.SGD),
            "class": type(opt).__name__,
            "update": (before - model.weight.detach()).tolist(),  # lr * averaged gradient
        }
        out["dup_names"] = err(
            lambda: hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=1.0),
                named_parameters=[("w", model.weight), ("w", model.weight)],
            )
        )
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        out["zero_grad_early"] = err(opt.zero_grad)  # Horovod: AssertionError
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        return out

    def test_wraps_and_averages(self, job):
        for res in by_rank(job, type(self)):
            assert res["isinstance"] is True  # a subclass of the wrapped optimizer's class
            assert res["update"] == [[1.5, 1.5]]  # mean of inputs 1 and 2

    def test_errors(self, job):
        for res in by_rank(job, type(self)):
            assert "ValueError" in res["dup_names"][1]  # Horovod: ValueError for duplicate names
            assert "AssertionError" in res["zero_grad_early"][1]


@covers("SyncBatchNorm")
class TestSyncBatchNorm:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        torch.manual_seed(3)
        full = torch.randn(4, 3, 5)
        bn = hvd.SyncBatchNorm(3)
        out = bn(full[2 * r : 2 * r + 2])
        return {
            "out": out.detach(),
            "running_mean": bn.running_mean.clone(),
            "is_batchnorm": isinstance(bn, torch.nn.modules.batchnorm._BatchNorm),
            "bad_dim": err(lambda: bn(torch.ones(3))),
        }

    def test_matches_batchnorm_on_the_global_batch(self, job):
        torch.manual_seed(3)
        full = torch.randn(4, 3, 5)
        ref = torch.nn.BatchNorm1d(3)
        want = ref(full).detach()
        for r, res in enumerate(by_rank(job, type(self))):
            assert res["is_batchnorm"] is True
            torch.testing.assert_close(res["out"], want[2 * r : 2 * r + 2], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(res["running_mean"], ref.running_mean, rtol=1e-5, atol=1e-6)
            assert "ValueError" in res["bad_dim"][1]  # Horovod: ValueError('expected at least 2D input')
