"""broadcast_parameters / broadcast_optimizer_state / broadcast_object /
allgather_object, SyncBatchNorm against BatchNorm on the full batch, the
capability queries and the public names of horovod.torch."""

import pytest
import torch
from helpers import run_pooled
from torch_wire import from_wire, to_wire

# Every public name of horovod.torch 0.28 that issue 4 lists.
HOROVOD_TORCH_NAMES = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "mpi_threads_supported",
    "mpi_built",
    "mpi_enabled",
    "gloo_built",
    "gloo_enabled",
    "nccl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "sparse_allreduce_async",
    "join",
    "barrier",
    "poll",
    "synchronize",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "Compression",
    "DistributedOptimizer",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
    "SyncBatchNorm",
    "ProcessSet",
    "add_process_set",
    "remove_process_set",
    "global_process_set",
    "start_timeline",
    "stop_timeline",
    "HorovodInternalError",
]


def test_every_horovod_torch_name_exists():
    import hvdlite.torch as hvd

    assert [n for n in HOROVOD_TORCH_NAMES if not hasattr(hvd, n)] == []
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert hvd.Compression.none.compress(torch.ones(1))[1] is None


def _broadcasts():
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(100 + r)  # every rank starts different
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1), betas=(0.9, 0.99 - 0.01 * r))
    if r == 0:  # only the root has stepped: state exists there only
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    named = torch.nn.Linear(2, 2)
    hvd.broadcast_parameters(named.named_parameters(), root_rank=1)  # a generator, as often passed
    sgd = torch.optim.SGD(named.parameters(), lr=0.5 + r)  # stateless: only hyperparameters
    hvd.broadcast_optimizer_state(sgd, root_rank=1)
    out = {
        "state_dict": dict(model.state_dict()),
        "named": dict(named.state_dict()),
        "adam_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "adam_state": {k: dict(v) for k, v in opt.state_dict()["state"].items()},
        "sgd_lr": sgd.param_groups[0]["lr"],
        "object": hvd.broadcast_object({"rank": r, "list": [r] * 3} if r == 1 else None, root_rank=1),
        "objects": hvd.allgather_object(("rank", r, "x" * r)),
        "lbfgs": None,
    }
    try:
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(named.parameters()), 0)
    except ValueError as e:
        out["lbfgs"] = str(e)
    hvd.shutdown()
    return to_wire(out)


@pytest.mark.parametrize("size", [3])
def test_broadcast_parameters_optimizer_state_and_objects(size):
    results = from_wire(run_pooled(_broadcasts, size, timeout=60))
    root = results[0]
    assert root["adam_state"], "the root's Adam state must exist"
    for _r, res in enumerate(results):
        for key, value in root["state_dict"].items():
            assert torch.equal(res["state_dict"][key], value), key
        for key, value in results[1]["named"].items():
            assert torch.equal(res["named"][key], value), key
        assert res["adam_groups"] == root["adam_groups"]
        for pid, state in root["adam_state"].items():
            for key, value in state.items():
                assert torch.equal(res["adam_state"][pid][key], value), (pid, key)
        assert res["sgd_lr"] == 1.5
        assert res["object"] == {"rank": 1, "list": [1, 1, 1]}
        assert res["objects"] == [("rank", k, "x" * k) for k in range(size)]
        assert "LBFGS" in res["lbfgs"]


def _sync_batch_norm(batch, dims):
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    full = batch[:, :]
    rows = [k for k in range(full.shape[0]) if k % n == r]  # uneven shards when n does not divide
    bn = hvd.SyncBatchNorm(full.shape[1], momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.arange(1.0, full.shape[1] + 1))
        bn.bias.fill_(0.5)
    x = full[rows].clone().requires_grad_()
    y = bn(x)
    upstream = torch.arange(float(full.numel()), dtype=torch.float64).reshape(full.shape).sin()[rows]
    y.backward(upstream)
    bn.eval()
    eval_out = bn(full[rows])
    out = {
        "y": y,
        "grad": x.grad,
        "rows": rows,
        "weight_grad": hvd.allreduce(bn.weight.grad, op=hvd.Sum),
        "bias_grad": hvd.allreduce(bn.bias.grad, op=hvd.Sum),
        "running_mean": bn.running_mean,
        "running_var": bn.running_var,
        "eval": eval_out,
    }
    hvd.shutdown()
    return to_wire(out)


@pytest.mark.parametrize("dims", [2, 4])
def test_sync_batch_norm_matches_batch_norm_on_the_full_batch(dims):
    torch.manual_seed(3)
    shape = (7, 3) if dims == 2 else (5, 3, 2, 2)
    batch = torch.randn(*shape, dtype=torch.float64) * 2 + 1
    results = from_wire(run_pooled(_sync_batch_norm, 2, args=(batch, dims), timeout=90))
    bn = (torch.nn.BatchNorm1d if dims == 2 else torch.nn.BatchNorm2d)(shape[1], momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.arange(1.0, shape[1] + 1))
        bn.bias.fill_(0.5)
    x = batch.clone().requires_grad_()
    y = bn(x)
    y.backward(torch.arange(float(batch.numel()), dtype=torch.float64).reshape(shape).sin())
    bn.eval()
    for res in results:
        rows = res["rows"]
        assert torch.allclose(res["y"], y[rows].detach(), atol=1e-10)
        assert torch.allclose(res["grad"], x.grad[rows], atol=1e-10)
        assert torch.allclose(res["weight_grad"], bn.weight.grad, atol=1e-10)
        assert torch.allclose(res["bias_grad"], bn.bias.grad, atol=1e-10)
        assert torch.allclose(res["running_mean"], bn.running_mean, atol=1e-12)
        assert torch.allclose(res["running_var"], bn.running_var, atol=1e-12)
        assert torch.allclose(res["eval"], bn(batch[rows]).detach(), atol=1e-10)


def test_capabilities():
    import hvdlite.torch as hvd
    from hvdlite import _core

    # gloo_built() reports the native ring backend, which every build includes
    assert hvd.gloo_built() is True and _core.build_info()["ring"] is True
    assert hvd.mpi_built() == _core.build_info()["mpi"]
    # Horovod's nccl_built(): an int, NCCL_VERSION_CODE (e.g. 23203) when built, else 0
    assert type(hvd.nccl_built()) is int and bool(hvd.nccl_built()) == _core.build_info()["nccl"]
    assert hvd.rocm_built() is False
    assert hvd.ccl_built() is False and hvd.cuda_built() == _core.build_info()["cuda"]
    assert hvd.gloo_enabled() is False  # not initialized: no job yet
    if not hvd.mpi_enabled():
        with pytest.raises(hvd.HvdliteError):
            hvd.mpi_threads_supported()


def test_init_with_a_communicator_is_not_supported():
    import hvdlite.torch as hvd

    with pytest.raises(hvd.NotSupportedError):
        hvd.init(comm=[0])
