"""CUDA tensors through torch.distributed's "hvdlite" backend (marked `gpu`; skipped with the
reason where there is no GPU or no NCCL module): all_reduce and broadcast run on the core's GPU
path, the other collectives through a host copy, results back on the tensor's device."""

import pytest
from cuda_skip import skip_without_cuda
from helpers import run_ranks


def _one_rank_cuda():
    import torch
    import torch.distributed as dist

    import hvdlite.torch  # noqa: F401

    dist.init_process_group("hvdlite")
    try:
        x = torch.arange(8, dtype=torch.float32, device="cuda")
        dist.all_reduce(x)
        out = torch.zeros(8, device="cuda")
        dist.all_gather_into_tensor(out, torch.ones(8, device="cuda"))
        y = torch.full((4,), 3.0, device="cuda")
        dist.broadcast(y, src=0)
        torch.cuda.synchronize()
        return x.cpu().tolist(), out.cpu().tolist(), y.cpu().tolist(), out.device.type
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_cuda_tensors_through_the_backend_on_one_rank():
    skip_without_cuda()
    x, gathered, y, device = run_ranks(_one_rank_cuda, 1, timeout=120)[0]
    assert x == [float(i) for i in range(8)] and gathered == [1.0] * 8 and y == [3.0] * 4
    assert device == "cuda"
