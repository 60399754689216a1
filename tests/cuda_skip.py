"""The one rule for skipping a torch CUDA test, shared by the GPU test files: torch must be
importable and see a CUDA device, and (for the core's CUDA paths) hvdlite must have been built
with its NCCL module. Each skip says which of these is missing."""

import os

import pytest

import hvdlite

NCCL_MODULE = os.path.join(os.path.dirname(hvdlite.__file__), "libhvdlite_cuda.so")


def skip_without_cuda(need_nccl_module=True):
    torch = pytest.importorskip("torch")
    if need_nccl_module and not os.path.exists(NCCL_MODULE):
        pytest.skip("hvdlite was built without its NCCL module (needs nvcc and the nvidia-nccl-cu13 wheel)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is False)")
