"""Compression.none / .fp16 / .bf16 / .powersgd / .topk / .sign for TensorFlow tensors (the policy is
in hvdlite.common.compression; this binds it to tf dtypes)."""

import tensorflow as tf

from hvdlite.common import compressors as _policy
from hvdlite.common.compression import FP16CompressorBase, make_compression
from hvdlite.tensorflow.compressors import TFPowerSGDCompressor, TFSignCompressor, TFTopKCompressor


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


def topk(ratio=0.01, min_numel=_policy.DEFAULT_MIN_NUMEL):
    """A new top-k compressor with error feedback (docs/compression.md)."""
    return TFTopKCompressor(ratio=ratio, min_numel=min_numel)


def sign(chunk=_policy.DEFAULT_SIGN_CHUNK, min_numel=_policy.DEFAULT_MIN_NUMEL):
    """A new scaled-sign (1-bit) compressor with error feedback (docs/compression.md)."""
    return TFSignCompressor(chunk=chunk, min_numel=min_numel)


def powersgd(rank=4, start_step=10, min_numel=_policy.DEFAULT_MIN_NUMEL):
    """A new PowerSGD compressor (low rank, warm start, error feedback; docs/compression.md)."""
    return TFPowerSGDCompressor(rank=rank, start_step=start_step, min_numel=min_numel)


Compression = make_compression(FP16Compressor, BF16Compressor, powersgd=powersgd, topk=topk, sign=sign)
