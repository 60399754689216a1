"""Compression.none / Compression.fp16 for TensorFlow tensors (the policy is
in hvdlite.common.compression; this binds it to tf dtypes)."""

import tensorflow as tf

from hvdlite.common.compression import FP16CompressorBase, make_compression


class FP16Compressor(FP16CompressorBase):
    """Floating-point tensors travel as tf.float16 and come back in their own dtype."""

    _float16 = tf.float16

    @staticmethod
    def _is_float(tensor):
        return tensor.dtype.is_floating

    @staticmethod
    def _cast(tensor, dtype):
        return tf.cast(tensor, dtype)


Compression = make_compression(FP16Compressor)
