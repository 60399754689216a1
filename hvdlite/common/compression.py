"""Gradient compression policy (Horovod's ``Compression.none`` / ``.fp16``),
written once for every framework.

A compressor maps a tensor to (wire tensor, context) before a collective and
back afterwards. ``FP16Compressor`` sends floating-point tensors as float16 and
restores their dtype; other tensors pass unchanged. An adapter binds the policy
to its framework by subclassing with three hooks: ``_is_float``, ``_float16``
(the framework's float16 dtype) and ``_cast``.
"""

from typing import Any

from hvdlite.common import exceptions


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    @classmethod
    def compress(cls, tensor):
        raise exceptions.NotSupportedError("%s does not implement compress()" % cls.__name__)

    @classmethod
    def decompress(cls, tensor, ctx):
        raise exceptions.NotSupportedError("%s does not implement decompress()" % cls.__name__)


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @classmethod
    def compress(cls, tensor):
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor


class FP16CompressorBase(Compressor):
    """Floating-point tensors travel as float16; ctx is the original dtype."""

    _float16: Any = None  # the framework's float16 dtype (set by each adapter)

    @staticmethod
    def _is_float(tensor):
        raise exceptions.NotSupportedError("an FP16 compressor must implement _is_float()")

    @staticmethod
    def _cast(tensor, dtype):
        raise exceptions.NotSupportedError("an FP16 compressor must implement _cast()")

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if cls._is_float(tensor) and dtype != cls._float16:
            tensor = cls._cast(tensor, cls._float16)
        return tensor, dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        if cls._is_float(tensor) and ctx is not None and tensor.dtype != ctx:
            tensor = cls._cast(tensor, ctx)
        return tensor


def make_compression(fp16_compressor):
    """Horovod's ``Compression`` namespace for one framework."""
    return type(
        "Compression",
        (),
        {
            "__doc__": "Optional gradient compression for allreduce: Compression.none or Compression.fp16.",
            "none": NoneCompressor,
            "fp16": fp16_compressor,
        },
    )
