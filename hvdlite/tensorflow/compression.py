"""Compression.none / .fp16 / .bf16 for TensorFlow tensors (the policy is
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


class BF16Compressor(FP16Compressor):
    """Floating-point tensors travel as tf.bfloat16 and come back in their own dtype."""

    _float16 = tf.bfloat16


# The stateful compressors (powersgd, topk, sign) exist for torch only so far.
Compression = make_compression(FP16Compressor, BF16Compressor)
