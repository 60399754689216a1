"""torch CUDA tensors through hvdlite.torch: the NCCL module for allreduce and broadcast, host
staging for the other collectives, and DistributedOptimizer on a CUDA model.

Marked `gpu`: skipped where torch has no CUDA device or hvdlite was built without its NCCL
module. A machine with one GPU runs the one-rank tests; two ranks on that one GPU must either
give the right sums or fail with an error that names the shared GPU and the fix (NCCL refuses
two members of one communicator on the same device).
"""

import pytest
from cuda_skip import skip_without_cuda
from helpers import run_ranks, spawn_ranks

pytestmark = pytest.mark.gpu


def _collectives_on_one_rank():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    dev = torch.device("cuda", 0)
    out = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.arange(1000, device=dev).to(dtype)
        y = hvd.allreduce(x, name="ar.%s" % dtype, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
        out["allreduce.%s" % dtype] = (y.device == dev, torch.equal(y, x))
        z = x.clone()
        hvd.allreduce_(z, name="ar_.%s" % dtype, op=hvd.Average)
        out["allreduce_.%s" % dtype] = (z.device == dev, torch.equal(z, x))
    grouped = hvd.grouped_allreduce([torch.full((n,), 3.0, device=dev) for n in (1, 7, 70001)], op=hvd.Sum)
    out["grouped"] = (all(g.device == dev for g in grouped), all(bool((g == 3.0).all()) for g in grouped))
    b = torch.arange(10, dtype=torch.float64, device=dev)
    hvd.broadcast_(b, root_rank=0, name="b")
    out["broadcast_"] = (b.device == dev, torch.equal(b, torch.arange(10, dtype=torch.float64, device=dev)))
    g = hvd.allgather(torch.ones(3, 2, device=dev), name="ag")
    out["allgather"] = (g.device == dev, tuple(g.shape) == (3, 2) and bool((g == 1).all()))
    a = hvd.alltoall(torch.arange(6.0, device=dev), name="a2a")
    out["alltoall"] = (a.device == dev, torch.equal(a, torch.arange(6.0, device=dev)))
    r = hvd.reducescatter(torch.arange(8.0, device=dev), name="rs", op=hvd.Sum)
    out["reducescatter"] = (r.device == dev, torch.equal(r, torch.arange(8.0, device=dev)))
    hvd.shutdown()
    return {k: [bool(v) for v in vals] for k, vals in out.items()}


def test_collectives_on_cuda_tensors_one_rank():
    skip_without_cuda()
    out = run_ranks(_collectives_on_one_rank, 1, timeout=180)[0]
    for key, (on_device, right) in out.items():
        assert on_device, "%s: the result left the GPU" % key
        assert right, "%s: wrong values" % key


def _train(distributed, steps):
    import torch

    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if distributed:
        import hvdlite.torch as hvd

        hvd.init()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen).to(dev)
        y = torch.randn(16, 4, generator=gen).to(dev)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    params = [p.detach().cpu().numpy().tobytes() for p in model.parameters()]
    if distributed:
        hvd.shutdown()
    return params


def test_distributed_optimizer_on_a_cuda_model_matches_plain_torch():
    skip_without_cuda()
    plain = run_ranks(_train, 1, args=(False, 5), timeout=180)[0]
    dist = run_ranks(_train, 1, args=(True, 5), timeout=180)[0]
    assert dist == plain, "one-rank DistributedOptimizer on CUDA must equal plain SGD bitwise"


def _two_ranks_one_gpu():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    x = torch.full((1000,), float(hvd.rank() + 1), device="cuda:0")
    try:
        y = hvd.allreduce(x, name="shared.gpu", op=hvd.Sum)
        return {"sum": y.cpu().tolist()[:3]}
    except hvd.HorovodInternalError as e:
        return {"error": str(e)}
    finally:
        hvd.shutdown()


def test_two_ranks_on_one_gpu_either_work_or_say_why():
    skip_without_cuda()
    results = spawn_ranks(_two_ranks_one_gpu, 2, timeout=240, env={"HVDLITE_START_TIMEOUT": "60"})
    for r in results:
        assert r.traceback is None and r.exitcode == 0, r.traceback
        if "sum" in r.value:
            assert r.value["sum"] == [3.0, 3.0, 3.0], r.value
        else:
            # Seen with NCCL 2.28 on one H200 and one H100: "Duplicate GPU detected". Torch tensors
            # are named "<kind>.<name>" on the wire, as in Horovod.
            msg = r.value["error"]
            for part in (
                "'allreduce.shared.gpu'",
                "ranks 0, 1",
                "one GPU",
                "torch.cuda.set_device(hvd.local_rank())",
            ):
                assert part in msg, msg
