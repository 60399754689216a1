"""The BufferAdapter for torch tensors: how a tensor reaches the core.

``describe`` makes the tensor's description (hvdlite/common/buffer.py) once per operation. A
contiguous tensor is passed by ``data_ptr()`` with no copy; any other layout goes through a
contiguous copy. CUDA tensors carry their device and current stream (the core's NCCL module runs
allreduce and broadcast on them; it refuses other collectives at submission with
NotSupportedError). Outputs the core allocates come back as uint8 NumPy arrays and are wrapped
with ``torch.from_numpy(...).view(dtype)`` (no copy; the array's owner frees the core's buffer
when the tensor dies). The other methods are this adapter's own helpers, for the torch modules
(mpi_ops, p2p_ops, the torch.distributed backend).
"""

import numpy as np
import torch

from hvdlite.common import dtypes, exceptions
from hvdlite.common.buffer import BufferAdapter, unsupported_dtype

CODES = {
    torch.uint8: dtypes.UINT8,
    torch.int8: dtypes.INT8,
    torch.int16: dtypes.INT16,
    torch.int32: dtypes.INT32,
    torch.int64: dtypes.INT64,
    torch.float16: dtypes.FLOAT16,
    torch.bfloat16: dtypes.BFLOAT16,
    torch.float32: dtypes.FLOAT32,
    torch.float64: dtypes.FLOAT64,
    torch.bool: dtypes.BOOL,
    torch.uint16: dtypes.UINT16,  # few torch operators take it, but collectives carry it
}


def _assign(dst, src):
    with torch.no_grad():
        dst.copy_(src if isinstance(src, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(src)))


def _wrap(data, shape, like):
    if data is None or data.size == 0:
        return torch.zeros(tuple(shape), dtype=like.dtype)
    return torch.from_numpy(data).view(like.dtype).reshape(tuple(shape))


class TorchBuffers(BufferAdapter):
    qualified_names = True  # 'allreduce.<name>', as Horovod's PyTorch names its operations

    def describe(self, tensor, name):
        # host_direct's conditions inline: the common case, in the cheapest tests.
        if tensor.is_cpu and tensor.layout is torch.strided and tensor.is_contiguous():
            code = CODES.get(tensor.dtype)
            if code is not None and not tensor.is_conj() and not tensor.is_neg():
                return (tensor.data_ptr(), code, tensor.shape, -1, 0, tensor, tensor, _assign, _wrap)
        self.check_device(tensor, name)
        code = CODES.get(tensor.dtype)
        if code is None:
            raise unsupported_dtype(name, tensor.dtype)
        work = tensor if self.is_direct(tensor) else self.contiguous_copy(tensor)
        device, stream = -1, 0
        if work.device.type == "cuda":
            # The current torch stream: the core's NCCL module orders its work after it (and
            # makes it wait for the result).
            device, stream = work.device.index, torch.cuda.current_stream(work.device).cuda_stream
        return (work.data_ptr(), code, tuple(work.shape), device, stream, tensor, work, _assign, _wrap)

    def check_device(self, tensor, name):
        """Raises for tensors the core cannot reach (memory of a device it has no backend for)
        or take (sparse)."""
        if tensor.device.type not in ("cpu", "cuda"):
            raise exceptions.NotSupportedError(
                "tensor '%s' is on %s; hvdlite runs collectives on CPU and CUDA tensors (move it with .cpu())"
                % (name, tensor.device)
            )
        if tensor.is_sparse:
            raise exceptions.InvalidArgumentError(
                "tensor '%s' is sparse; use sparse_allreduce_async or DistributedOptimizer(sparse_as_dense=True)"
                % name
            )

    def host_direct(self, tensor):
        """(data_ptr, dtype code) of a host tensor the core may use as it is (contiguous, writable,
        a supported dtype), else None: describe() then makes no copy and has no device."""
        if tensor.is_cpu and tensor.layout is torch.strided and tensor.is_contiguous():
            code = CODES.get(tensor.dtype)
            if code is not None and not tensor.is_conj() and not tensor.is_neg():
                return tensor.data_ptr(), code
        return None

    def is_direct(self, tensor):
        """True when the core may use `tensor`'s memory as it is (layout only; see check_device)."""
        return tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg()

    def contiguous_copy(self, tensor):
        """A new contiguous tensor with `tensor`'s values (never an alias)."""
        return tensor.detach().clone(memory_format=torch.contiguous_format).resolve_conj().resolve_neg()

    @staticmethod
    def stage_on_host(tensor):
        """True for tensors whose collectives other than allreduce / broadcast run
        on a host copy (the core's CUDA path has only those two)."""
        return tensor.device.type == "cuda"

    def copy_into(self, dst, src):
        """dst[...] = src, for same-shape tensors, outside any autograd record."""
        _assign(dst, src)


TORCH = TorchBuffers()
