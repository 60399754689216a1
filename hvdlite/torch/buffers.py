"""The BufferAdapter for torch tensors: how a tensor reaches the core.

A contiguous tensor is passed by ``data_ptr()`` with no copy; any other layout
goes through a contiguous copy. CUDA tensors carry their device and current
stream (the core's NCCL module runs allreduce and broadcast on them; it refuses
other collectives at submission with NotSupportedError). Outputs the core allocates come back
as uint8 NumPy arrays and are wrapped with ``torch.from_numpy(...).view(dtype)``
(no copy; the array's owner frees the core's buffer when the tensor dies).
"""

import numpy as np
import torch

from hvdlite.common import dtypes, exceptions
from hvdlite.common.collectives import BufferAdapter

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


class TorchBuffers(BufferAdapter):
    qualified_names = True  # 'allreduce.<name>', as Horovod's PyTorch names its operations

    def dtype_code(self, tensor):
        return CODES.get(tensor.dtype)

    def check_device(self, tensor, name):
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
        # check_device and is_direct's conditions for a dense CPU tensor, in the cheapest tests.
        if tensor.is_cpu and tensor.layout is torch.strided and tensor.is_contiguous():
            code = CODES.get(tensor.dtype)
            if code is not None and not tensor.is_conj() and not tensor.is_neg():
                return tensor.data_ptr(), code
        return None

    def is_direct(self, tensor):
        return tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg()

    def contiguous_copy(self, tensor):
        return tensor.detach().clone(memory_format=torch.contiguous_format).resolve_conj().resolve_neg()

    def pointer(self, tensor):
        return tensor.data_ptr()

    def device_kwargs(self, tensor):
        """CUDA tensors: their device and the current torch stream, which the core's
        NCCL module orders its work after (and makes wait for the result)."""
        if tensor.device.type != "cuda":
            return {}
        return {"device": tensor.device.index, "stream": torch.cuda.current_stream(tensor.device).cuda_stream}

    @staticmethod
    def stage_on_host(tensor):
        """True for tensors whose collectives other than allreduce / broadcast run
        on a host copy (the core's CUDA path has only those two)."""
        return tensor.device.type == "cuda"

    def shape(self, tensor):
        return tuple(tensor.shape)

    def copy_into(self, dst, src):
        with torch.no_grad():
            dst.copy_(src)

    def from_core(self, data, shape, like):
        if data is None or data.size == 0:
            return torch.zeros(tuple(shape), dtype=like.dtype)
        return torch.from_numpy(data).view(like.dtype).reshape(tuple(shape))

    def assign_float64(self, dst, values):
        with torch.no_grad():
            dst.copy_(torch.from_numpy(np.ascontiguousarray(values)))


TORCH = TorchBuffers()
