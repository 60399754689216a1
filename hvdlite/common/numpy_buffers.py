"""The BufferAdapter for NumPy arrays: used by the NumPy API (hvdlite.numpy_ops), by the
TensorFlow adapter (whose tensors reach the core as NumPy arrays: hvdlite/tensorflow/buffers.py)
and by framework-neutral helpers that move bytes (broadcast_object, ...).

A C-contiguous, aligned, writable array is handed to the core as the array itself: the core
reads its address through the buffer protocol, which costs far less than array.ctypes.data
(microseconds per call, most of a small operation's Python time). Any other goes through a
C-contiguous copy."""

import numpy as np

from hvdlite.common import dtypes
from hvdlite.common.buffer import BufferAdapter, unsupported_dtype

_CODES = {
    np.dtype(np.uint8): dtypes.UINT8,
    np.dtype(np.int8): dtypes.INT8,
    np.dtype(np.uint16): dtypes.UINT16,
    np.dtype(np.int16): dtypes.INT16,
    np.dtype(np.int32): dtypes.INT32,
    np.dtype(np.int64): dtypes.INT64,
    np.dtype(np.float16): dtypes.FLOAT16,
    np.dtype(np.float32): dtypes.FLOAT32,
    np.dtype(np.float64): dtypes.FLOAT64,
    np.dtype(np.bool_): dtypes.BOOL,
}


def _assign(dst, src):
    dst[...] = src


def _wrap(data, shape, like):
    if data is None:
        return np.zeros(shape, like.dtype)
    return data.view(like.dtype).reshape(shape)


class NumpyBuffers(BufferAdapter):
    def dtype_code(self, array):
        """The core dtype code of `array`, or None."""
        code = _CODES.get(array.dtype)
        if code is None and array.dtype.name == "bfloat16":  # ml_dtypes.bfloat16
            code = dtypes.BFLOAT16
        return code

    def describe(self, array, name):
        code = _CODES.get(array.dtype)
        # carray: C-contiguous, aligned and writeable, in one flag test (this runs per operation)
        if code is not None and array.flags.carray:
            return (array, code, array.shape, -1, 0, array, array, _assign, _wrap)
        code = self.dtype_code(array)
        if code is None:
            raise unsupported_dtype(name, array.dtype)
        work = array if array.flags.carray else np.array(array, copy=True, order="C")
        return (work, code, work.shape, -1, 0, array, work, _assign, _wrap)


NUMPY = NumpyBuffers()
