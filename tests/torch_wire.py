"""Carrying torch tensors back from test ranks: torch's multiprocessing pickler
would pass tensor storage by shared memory, which dies with the rank, so rank
functions return ``to_wire(result)`` and tests read ``from_wire(value)``."""

import torch

# Horovod 0.28.1's numeric dtypes (its test_torch.py's lists): every collective carries all of
# them; bool only moves (allgather, broadcast, alltoall). Shared by the torch op and parity tests.
NUMERIC_DTYPES = [
    torch.uint8,
    torch.int8,
    torch.uint16,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


class WireTensor:
    """A tensor as plain bytes: dtype name, shape, raw contents."""

    def __init__(self, tensor):
        t = tensor.detach().contiguous()
        self.dtype = str(t.dtype).replace("torch.", "")
        self.shape = tuple(t.shape)
        self.data = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""

    def tensor(self):
        dtype = getattr(torch, self.dtype)
        if not self.data:
            return torch.zeros(self.shape, dtype=dtype)
        return torch.frombuffer(bytearray(self.data), dtype=torch.uint8).view(dtype).reshape(self.shape)


def to_wire(obj):
    if isinstance(obj, torch.Tensor):
        return WireTensor(obj)
    if isinstance(obj, dict):
        return {k: to_wire(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_wire(v) for v in obj)
    return obj


def from_wire(obj):
    if isinstance(obj, WireTensor):
        return obj.tensor()
    if isinstance(obj, dict):
        return {k: from_wire(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_wire(v) for v in obj)
    return obj
