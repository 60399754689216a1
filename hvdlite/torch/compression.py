"""Horovod's ``Compression`` namespace for torch: the stateless casts
(``Compression.none``, ``.fp16``, ``.bf16``; policy in hvdlite.common.compression) and the
factories of the stateful compressors (``.powersgd``, ``.topk``, ``.sign``:
hvdlite/torch/compressors.py, sparse_compressors.py and sign_compressor.py), which
``DistributedOptimizer(compression=...)`` takes. docs/compression.md says which to pick."""

import torch

from hvdlite.common import compressors as _policy
from hvdlite.common.compression import FP16CompressorBase, make_compression
from hvdlite.torch.compressors import PowerSGDCompressor, StatefulCompressor
from hvdlite.torch.sign_compressor import SignCompressor
from hvdlite.torch.sparse_compressors import TopKCompressor


class FP16Compressor(FP16CompressorBase):
    """Floating-point tensors travel as torch.float16 and come back in their own dtype."""

    _float16 = torch.float16

    @staticmethod
    def _is_float(tensor):
        return tensor.dtype.is_floating_point

    @staticmethod
    def _cast(tensor, dtype):
        return tensor.to(dtype)


class BF16Compressor(FP16Compressor):
    """Floating-point tensors travel as torch.bfloat16 (float32's range, 8 bits of
    mantissa) and come back in their own dtype."""

    _float16 = torch.bfloat16


def powersgd(rank=4, start_step=10, min_numel=_policy.DEFAULT_MIN_NUMEL, cross_host_only=None):
    """A new PowerSGD compressor (low rank `rank`, warm start, error feedback); the first
    `start_step` steps of each gradient go uncompressed. cross_host_only (every stateful
    compressor): None compresses only the cross-host stage where the job spans hosts with
    2+ ranks each (exact inside a host), True requires that, False compresses every hop."""
    return PowerSGDCompressor(
        rank=rank, start_step=start_step, min_numel=min_numel, cross_host_only=cross_host_only
    )


def topk(ratio=0.01, momentum=0.0, min_numel=_policy.DEFAULT_MIN_NUMEL, fused=False, cross_host_only=None):
    """A new top-k compressor (the `ratio` largest entries, error feedback; momentum > 0:
    DGC's momentum correction, with a momentum-free optimizer; fused=True: chosen across
    all of a step's compressed gradients, one collective per step)."""
    return TopKCompressor(
        ratio=ratio, momentum=momentum, min_numel=min_numel, fused=fused, cross_host_only=cross_host_only
    )


def sign(chunk=_policy.DEFAULT_SIGN_CHUNK, min_numel=_policy.DEFAULT_MIN_NUMEL, cross_host_only=None):
    """A new scaled-sign compressor (1 bit per element + a scale per chunk of rows, error
    feedback)."""
    return SignCompressor(chunk=chunk, min_numel=min_numel, cross_host_only=cross_host_only)


Compression = make_compression(FP16Compressor, BF16Compressor, powersgd=powersgd, topk=topk, sign=sign)

__all__ = ["BF16Compressor", "Compression", "FP16Compressor", "StatefulCompressor"]
