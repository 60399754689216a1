"""One framework tensor as the shared code sees it: a ``Buffer`` record, made once.

Each adapter (``hvdlite/common/numpy_buffers.py`` for NumPy and TensorFlow, whose tensors reach
the core as NumPy arrays; ``hvdlite/torch/buffers.py`` for torch) implements
``BufferAdapter.describe(tensor, name)``: it checks the tensor (device, layout, dtype), makes a
contiguous copy where the core cannot use the tensor's memory as it is, and returns a ``Buffer``.
From then on the shared code (``collectives.py``, ``p2p.py``, ``adasum.py``) works on that
record alone: it never asks the adapter anything more about the tensor.

Ownership: a Buffer references the caller's tensor and the tensor whose memory ``data`` is;
whoever hands ``data`` to the core keeps the record (or ``keepalive``) referenced until the
operation completes. The record is immutable and holds no lock; making one costs one tuple.
"""

import abc
import collections

from hvdlite.common import dtypes, exceptions


class Buffer(collections.namedtuple("Buffer", "data code shape device stream tensor work")):
    """data: what ops.submit / ops.run take: an address (int) or a C-contiguous object with the
        buffer protocol (a NumPy array), whose memory the core reads and writes.
    code: the core dtype code (hvdlite.common.dtypes).
    shape: a sequence of ints (a tuple, torch.Size).
    device / stream: the CUDA device and cudaStream_t (int) of device memory; -1 / 0 for host
        memory (ops.submit's device= / stream=).
    tensor: the caller's tensor.
    work: the tensor whose memory `data` is: `tensor` itself when the core uses it directly,
        else a contiguous copy, which an in-place operation copies back into `tensor`.

    Each adapter subclasses it with the two things only it knows how to do, assign() and
    wrap(); the shared code calls nothing else of the adapter's. An adapter makes its records
    with make() (no Python-level constructor: this runs once per tensor per operation)."""

    __slots__ = ()

    @property
    def direct(self):
        """True when the core works on the caller's tensor itself (no copy to write back)."""
        return self.work is self.tensor

    @property
    def keepalive(self):
        """What must stay referenced while the core uses `data`."""
        return (self.tensor, self.work)

    def nbytes(self):
        """The buffer's size in bytes."""
        count = 1
        for d in self.shape:
            count *= int(d)
        return count * dtypes.ITEM_BYTES[self.code]

    def address(self):
        """`data` as an address (int), for calls that take no buffer-protocol object."""
        data = self.data
        return data if isinstance(data, int) else data.__array_interface__["data"][0]

    @staticmethod
    def assign(dst, src):
        """Writes `src` (a tensor of the adapter's kind, or a NumPy array of dst's shape, any
        dtype) into `dst`, rounded to dst's dtype, outside any autograd record."""
        raise NotImplementedError

    def wrap(self, data, shape):
        """The core's output (a uint8 NumPy array, or None when empty) as a tensor of this
        buffer's dtype with `shape`, without a copy."""
        raise NotImplementedError

    def copy_back(self):
        """Writes the work copy into the caller's tensor (after an in-place operation); nothing
        when the core worked on the tensor itself."""
        if self.work is not self.tensor:
            self.assign(self.tensor, self.work)


# make(cls, (data, code, shape, device, stream, tensor, work)): a record of the Buffer subclass
# `cls`, built as the tuple it is (namedtuple's own __new__ is a Python function call).
make = tuple.__new__


def unsupported_dtype(name, dtype):
    """The NotSupportedError for a tensor whose dtype the core does not carry."""
    return exceptions.NotSupportedError(
        "tensor '%s' has dtype %s, which hvdlite does not support; use one of %s"
        % (name, dtype, ", ".join(sorted(dtypes.CODE_BY_NAME)))
    )


class BufferAdapter(abc.ABC):
    """What the shared code needs from one framework: describe(). Subclasses implement it."""

    # Given names become '<kind>.<name>' on the wire (naming.auto_name), as Horovod's PyTorch does.
    qualified_names = False

    @abc.abstractmethod
    def describe(self, tensor, name):
        """The Buffer of `tensor`, made once at the adapter's edge. Raises NotSupportedError
        (naming `name`) for a dtype the core does not carry or memory it cannot reach, and
        InvalidArgumentError for a layout it cannot take (a sparse tensor). Runs once per tensor
        per operation, so its common case (a contiguous host tensor) must be cheap."""
