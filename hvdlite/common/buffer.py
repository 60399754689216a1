"""One framework tensor as the shared code sees it: a buffer description, made once.

Each adapter (``hvdlite/common/numpy_buffers.py`` for NumPy and TensorFlow, whose tensors reach
the core as NumPy arrays; ``hvdlite/torch/buffers.py`` for torch) implements
``BufferAdapter.describe(tensor, name)``: it checks the tensor (device, layout, dtype), makes a
contiguous copy where the core cannot use the tensor's memory as it is, and returns the
tensor's description, a plain tuple of these fields, in this order (``FIELDS``):

    data    what ops.submit / ops.run take: an address (int) or a C-contiguous object with the
            buffer protocol (a NumPy array), whose memory the core reads and writes
    code    the core dtype code (hvdlite.common.dtypes)
    shape   a sequence of ints (a tuple, torch.Size)
    device  the CUDA device of device memory; -1 for host memory (ops.submit's device=)
    stream  the framework's current cudaStream_t as an int; 0 for host memory (stream=)
    tensor  the caller's tensor
    work    the tensor whose memory `data` is: `tensor` itself when the core uses it directly,
            else a contiguous copy, which an in-place operation copies back into `tensor`
    assign  assign(dst, src) writes `src` (a tensor of the adapter's kind, or a NumPy array of
            dst's shape, any dtype) into `dst`, rounded to dst's dtype, outside any autograd
            record: how a work copy (or Adasum's float64 result) goes back into `tensor`
    wrap    wrap(data, shape, like) the core's output (a uint8 NumPy array, or None when empty)
            as a tensor of `like`'s dtype with `shape`, without a copy

From then on the shared code (``collectives.py``, ``p2p.py``, ``adasum.py``) works on that
description alone, unpacking it by these names: it asks the adapter nothing more about the
tensor. A plain tuple, not a named one: describe() runs once per tensor per operation, and
building a tuple subclass costs more than the rest of the description (about 0.13 us a call).

Ownership: the description references the caller's tensor and its work copy; whoever hands
`data` to the core keeps `tensor` and `work` referenced until the operation completes. It is
immutable and holds no lock.
"""

import abc

from hvdlite.common import dtypes, exceptions

FIELDS = ("data", "code", "shape", "device", "stream", "tensor", "work", "assign", "wrap")


class BufferAdapter(abc.ABC):
    """What the shared code needs from one framework: describe(). Subclasses implement it."""

    # Given names become '<kind>.<name>' on the wire (naming.auto_name), as Horovod's PyTorch does.
    qualified_names = False

    @abc.abstractmethod
    def describe(self, tensor, name):
        """The description of `tensor` (the tuple of FIELDS), made once at the adapter's edge.
        Raises NotSupportedError (naming `name`) for a dtype the core does not carry or memory it
        cannot reach, and InvalidArgumentError for a layout it cannot take (a sparse tensor).
        Runs once per tensor per operation, so its common case (a contiguous host tensor) must
        be cheap."""


def nbytes(code, shape):
    """The size in bytes of a buffer of dtype `code` and `shape`."""
    count = 1
    for d in shape:
        count *= int(d)
    return count * dtypes.ITEM_BYTES[code]


def address(data):
    """A description's `data` as an address (int), for calls that take no buffer-protocol object."""
    return data if isinstance(data, int) else data.__array_interface__["data"][0]


def unsupported_dtype(name, dtype):
    """The NotSupportedError for a tensor whose dtype the core does not carry."""
    return exceptions.NotSupportedError(
        "tensor '%s' has dtype %s, which hvdlite does not support; use one of %s"
        % (name, dtype, ", ".join(sorted(dtypes.CODE_BY_NAME)))
    )
