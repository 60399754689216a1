"""Compression.none / Compression.fp16 for torch tensors (the policy is in
hvdlite.common.compression; this binds it to torch dtypes)."""

import torch

from hvdlite.common.compression import FP16CompressorBase, make_compression


class FP16Compressor(FP16CompressorBase):
    """Floating-point tensors travel as torch.float16 and come back in their own dtype."""

    _float16 = torch.float16

    @staticmethod
    def _is_float(tensor):
        return tensor.dtype.is_floating_point

    @staticmethod
    def _cast(tensor, dtype):
        return tensor.to(dtype)


Compression = make_compression(FP16Compressor)
