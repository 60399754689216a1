"""Gradient compression policy (Horovod's ``Compression.none`` / ``.fp16``, and
``.bf16``), written once for every framework.

A stateless compressor maps a tensor to (wire tensor, context) before a collective
and back afterwards. ``FP16Compressor`` sends floating-point tensors as float16 and
restores their dtype; ``BF16Compressor`` does the same with bfloat16; other tensors
pass unchanged. An adapter binds the policy to its framework by subclassing with
three hooks: ``_is_float``, ``_float16`` (the framework's target dtype: float16 or
bfloat16) and ``_cast``.

The stateful compressors (PowerSGD, top-k, scaled sign: error feedback, their own
collectives) are instances, not classes; their policy is in
``hvdlite/common/compressors.py`` and ``make_compression`` adds their factories.
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
    """Floating-point tensors travel as float16 (or the adapter's ``_float16``: bfloat16
    for a BF16 compressor); ctx is the original dtype."""

    _float16: Any = None  # the framework's target dtype (set by each adapter)

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


def make_compression(fp16_compressor, bf16_compressor=None, **factories):
    """Horovod's ``Compression`` namespace for one framework: ``none``, ``fp16``, ``bf16``
    (when the adapter has one) and the factories of stateful compressors
    (``powersgd``, ``topk``, ``sign``: each call makes a new compressor instance)."""
    names = ["none", "fp16"] + (["bf16"] if bf16_compressor is not None else []) + sorted(factories)
    namespace = {
        "__doc__": "Optional gradient compression: Compression.%s." % ", .".join(names),
        "none": NoneCompressor,
        "fp16": fp16_compressor,
    }
    if bf16_compressor is not None:
        namespace["bf16"] = bf16_compressor
    namespace.update({name: staticmethod(factory) for name, factory in factories.items()})
    return type("Compression", (), namespace)
