"""Aligned host buffers reused across training steps.

An adapter whose collectives must not write into the caller's memory (TensorFlow: an op's
input tensor may have other consumers) reduces a copy instead. A fresh large NumPy array is
a fresh mmap: every page faults and is zeroed by the kernel on first touch, which costs
about three times the copy itself (64 MiB: ~13 ms fresh against ~4 ms reused on the 2-core
machines). The same gradient shapes come back every step, so the pool hands out the memory
of an earlier step once nothing refers to it any more.

Contracts:
  - ``take(dtype, shape)`` returns a C-contiguous, writable array whose data is ``alignment``
    bytes aligned and that no other live object references: a view of a pooled raw buffer.
    The caller owns the view; the buffer returns to the pool when the last reference to the
    view (and to any view derived from it) is gone. "Referenced" is CPython's reference count
    of the raw buffer, so anything holding the memory must hold a Python reference to it:
    the core's keepalive does (hvdlite.common.ops.register), and so do TensorFlow tensors that
    adopt an array without a copy (numpy_function outputs, DLPack). Memory handed to
    anything that does not hold such a reference must not come from here.
  - Reused buffers are not cleared: callers overwrite every element.
  - At most ``capacity`` bytes of idle buffers are kept; the least recently used idle ones
    are dropped beyond that. Buffers in use are never dropped (they are freed normally when
    their last user lets go).
  - Thread-safe (a lock); take() never blocks on anything but that lock.
"""

import collections
import sys
import threading

import numpy as np

# Alignment of the buffers: 64 bytes, the strictest any adapter asks for (TensorFlow adopts a
# NumPy array as a tensor without a copy only at 64 bytes). The core itself needs no more than
# each element's own alignment (NumPy's flags.aligned, part of numpy_buffers.is_direct).
ALIGNMENT = 64
# Idle bytes kept for reuse: a few steps' worth of gradients of a mid-sized model.
CAPACITY = 1 << 30


def _refcount(raw):
    return sys.getrefcount(raw)


def _calibrate():
    """_refcount() of a buffer held only by a pool list and a loop variable (the way the pool
    calls it), measured rather than assumed from one CPython version's internals."""
    count = 0
    for raw in [np.empty(1, np.uint8)]:
        count = _refcount(raw)
    return count


_IDLE_REFS = _calibrate()


class AlignedPool:
    def __init__(self, alignment=ALIGNMENT, capacity=CAPACITY):
        self._alignment = alignment
        self._capacity = capacity
        # nbytes -> raw uint8 buffers (nbytes + alignment long), most recently used last
        self._buffers = collections.OrderedDict()
        self._lock = threading.Lock()

    def take(self, dtype, shape):
        """An aligned, writable, C-contiguous array of `dtype` and `shape` (see module doc)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        with self._lock:
            raw = self._idle(nbytes)
            if raw is None:
                raw = np.empty(nbytes + self._alignment, np.uint8)
                self._buffers.setdefault(nbytes, []).append(raw)
                self._trim()
            self._buffers.move_to_end(nbytes)
        offset = (-raw.ctypes.data) % self._alignment
        return raw[offset : offset + nbytes].view(dtype).reshape(shape)

    def copy(self, array):
        """take() filled with `array`'s values."""
        array = np.asarray(array)
        out = self.take(array.dtype, array.shape)
        out[...] = array
        return out

    def _idle(self, nbytes):
        for raw in self._buffers.get(nbytes, ()):
            if _refcount(raw) <= _IDLE_REFS:
                return raw
        return None

    def _trim(self):
        """Drops least recently used idle buffers while the idle ones exceed the capacity."""
        idle = [(n, raw) for n, raws in self._buffers.items() for raw in raws if _refcount(raw) <= _IDLE_REFS]
        total = sum(raw.nbytes for _, raw in idle)
        for nbytes, raw in idle:  # oldest size first
            if total <= self._capacity:
                return
            self._buffers[nbytes].remove(raw)
            total -= raw.nbytes
            if not self._buffers[nbytes]:
                del self._buffers[nbytes]
