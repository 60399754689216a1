"""The BufferAdapter for NumPy arrays: used by the NumPy API (hvdlite.numpy_ops)
and by framework-neutral helpers that move bytes (broadcast_object, ...)."""

import numpy as np

from hvdlite.common import dtypes
from hvdlite.common.collectives import BufferAdapter

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


class NumpyBuffers(BufferAdapter):
    def dtype_code(self, array):
        code = _CODES.get(array.dtype)
        if code is None and array.dtype.name == "bfloat16":  # ml_dtypes.bfloat16
            code = dtypes.BFLOAT16
        return code

    def host_direct(self, array):
        # The array itself: the core reads its address through the buffer protocol.
        code = _CODES.get(array.dtype) if array.flags.carray else None
        return None if code is None else (array, code)

    def is_direct(self, array):
        # carray: C-contiguous, aligned and writeable, in one flag test (this runs per operation)
        return array.flags.carray

    def contiguous_copy(self, array):
        return np.array(array, copy=True, order="C")

    def pointer(self, array):
        return array.ctypes.data

    def shape(self, array):
        return array.shape

    def copy_into(self, dst, src):
        dst[...] = src

    def from_core(self, data, shape, like):
        if data is None:
            return np.zeros(shape, like.dtype)
        return data.view(like.dtype).reshape(shape)

    def assign_float64(self, dst, values):
        dst[...] = values.astype(dst.dtype)


NUMPY = NumpyBuffers()
