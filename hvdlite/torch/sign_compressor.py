"""``Compression.sign`` for torch gradients: 1-bit (scaled sign) with error feedback, sent
through one allgather (or, past the allgather's crossover, densified through an allreduce)
and summed in rank order on every rank, so all of them hold the same bits. On the CPU the
core's fused loops (csrc/python/sign_kernels.cc) encode and decode; elsewhere the torch/NumPy
reference below, which computes the same bits. Contracts as in hvdlite/torch/compressors.py.
"""

import numpy as np
import torch

from hvdlite.common import compressors as policy
from hvdlite.common.native import core
from hvdlite.torch import mpi_ops
from hvdlite.torch.compressors import StatefulCompressor, _Pending
from hvdlite.torch.sparse_compressors import _dense_pending, _gather_pending

_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)
# Row b: the 8 elements a byte b of packed sign bits stands for, +1.0 where a bit is 0 and
# -1.0 where it is 1 (bit i of byte j = element 8 j + i).
_SIGN_TABLE_NP = np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little"), -1.0, 1.0
).astype(np.float32)
_SIGN_TABLE = torch.from_numpy(_SIGN_TABLE_NP)


def _pack_bits_torch(bits, nbytes):
    padded = torch.zeros(nbytes * 8, dtype=torch.uint8, device=bits.device)
    padded[: bits.numel()] = bits.view(-1)
    return (padded.view(-1, 8) * _BIT_WEIGHTS.to(bits.device)).sum(1, dtype=torch.uint8)


def _unpack_bits_torch(packed, n):
    shifts = _BIT_SHIFTS.to(packed.device)
    return ((packed.view(-1, 1) >> shifts) & 1).view(-1)[:n]


def _pack_numpy(bits, nbytes):
    packed = np.packbits(bits, bitorder="little")
    out = torch.zeros(nbytes, dtype=torch.uint8)
    out[: packed.size] = torch.from_numpy(packed)
    return out


def _signs_of_bits_torch(packed, n):
    table = _SIGN_TABLE.to(packed.device)
    return table.index_select(0, packed.long()).view(-1)[:n]


def pack_bits(bits, nbytes):
    """A bool tensor as `nbytes` uint8, bit i of byte j = element 8 j + i (NumPy's
    packbits on the CPU, 50x faster than the torch arithmetic used on other devices)."""
    if bits.device.type != "cpu":
        return _pack_bits_torch(bits, nbytes)
    return _pack_numpy(bits.view(-1).numpy(), nbytes)


def unpack_bits(packed, n):
    """pack_bits' inverse: the first n bits, as uint8 0 or 1."""
    if packed.device.type != "cpu":
        return _unpack_bits_torch(packed, n)
    return torch.from_numpy(np.unpackbits(packed.numpy(), count=n, bitorder="little"))


def sign_bits(flat, nbytes):
    """pack_bits of the sign bits of float32 `flat` (-0.0 counts as negative, as copysign
    reads it); on the CPU NumPy's signbit, 3x faster than torch's."""
    if flat.device.type != "cpu":
        return _pack_bits_torch(torch.signbit(flat), nbytes)
    return _pack_numpy(np.signbit(flat.numpy()), nbytes)


def signs_of_bits(packed, n):
    """+1.0 where a packed bit is 0, -1.0 where it is 1: float32, the first n elements. One
    table lookup per byte (8 elements), a single pass: scale x sign is then exactly what
    copysign(scale, x) gives for the x the bit came from."""
    if packed.device.type != "cpu":
        return _signs_of_bits_torch(packed, n)
    return torch.from_numpy(np.take(_SIGN_TABLE_NP, packed.numpy(), axis=0)).view(-1)[:n]


def _chunk_views(flat, chunk):
    """Views of `flat` by chunk: its full chunks as one (full, chunk) view, then the short
    last chunk (if any) as a (1, rest) view."""
    full = flat.numel() // chunk
    views = [flat[: full * chunk].view(full, chunk)] if full else []
    if full * chunk < flat.numel():
        views.append(flat[full * chunk :].view(1, -1))
    return views


def _chunk_columns(per_chunk, n, chunk):
    """`per_chunk` (one value per chunk) as columns matching _chunk_views of n elements."""
    full = n // chunk
    columns = [per_chunk[:full].view(-1, 1)] if full else []
    if full * chunk < n:
        columns.append(per_chunk[full:].view(1, 1))
    return columns


def _scaled_into(out, signs, scales, chunk, accumulate):
    """out (flat, float32) = or += each chunk's scale x `signs` (+-1.0): exact products, so
    the value for an element is copysign(scale, x) of the element x that sent its bit."""
    n = signs.numel()
    out = torch.empty_like(signs) if out is None else out
    parts = zip(_chunk_views(out, chunk), _chunk_views(signs, chunk), _chunk_columns(scales, n, chunk))
    for o, sg, s in parts:
        if accumulate:
            o.addcmul_(s, sg)
        else:
            torch.mul(sg, s, out=o)
    return out


class SignCompressor(StatefulCompressor):
    """Scaled sign (1-bit) with error feedback: each chunk of whole rows (at least `chunk`
    elements) of (gradient + residual) is sent as its signs, packed 8 to a byte, and one
    float32 scale, the chunk's mean magnitude (the scale that minimizes the chunk's
    squared error); the residual is what that leaves out."""

    method = "sign"

    def __init__(
        self, chunk=policy.DEFAULT_SIGN_CHUNK, min_numel=policy.DEFAULT_MIN_NUMEL, cross_host_only=None
    ):
        super().__init__(min_numel, cross_host_only)
        self.chunk = policy.check_positive_int(chunk, "sign chunk")

    def _describe(self):
        return "chunk=%d, min_numel=%d" % (self.chunk, self.min_numel)

    def _plan(self, shape, is_float, itemsize, size):
        return policy.sign_plan(shape, is_float, itemsize, self.chunk, size, self.min_numel)

    def _start_from_grad(self, name, grad, plan, process_set):
        """Where the core's loop serves: gradient + residual, the scales, the bits and the
        new residual in one pass (sign_kernels.cc); else _corrected, then _start."""
        residual = self._state.local_of(name).get("residual")
        fits = residual is None or (_fused_ok(residual) and residual.shape == grad.shape)
        if not (_fused_ok(grad) and fits):
            return super()._start_from_grad(name, grad, plan, process_set)
        # The new residual overwrites the old where this compressor owns it (no state_dict()
        # handed it out since), else goes into a new tensor (the old stays a snapshot).
        reuse = residual is not None and self._state.owns(name, "residual")
        x = residual if reuse else torch.empty(grad.shape, dtype=torch.float32)
        return self._encode(name, x, grad, residual, plan, process_set)

    def _start(self, name, corrected, plan, process_set):
        """`corrected` (gradient + residual) is the compressor's own new tensor: the new
        residual x - copysign(scale, x) is left in it."""
        if _fused_ok(corrected):
            return self._encode(name, corrected, None, None, plan, process_set)
        flat = corrected.view(-1)
        chunk, _ = policy.sign_layout(tuple(corrected.shape), self.chunk)
        nbytes = 4 * (-(-flat.numel() // 32))
        scales = chunk_abs_means(flat, chunk)
        bits, decoder = _reference_encode(flat, chunk, scales, nbytes)
        self._state.put(name, "residual", corrected)
        wire = torch.cat([bits, scales.view(torch.uint8)])
        return self._exchange(name, wire, nbytes, decoder, plan, process_set)

    def _encode(self, name, x, grad, residual, plan, process_set):
        """The core's loop: x = grad + residual (x as it is when grad is None), encoded into
        a new wire segment (bits, then the float32 scales), the new residual left in x."""
        n = x.numel()
        chunk, chunks = policy.sign_layout(tuple(x.shape), self.chunk)
        nbytes = 4 * (-(-n // 32))
        wire = torch.empty(nbytes + 4 * chunks, dtype=torch.uint8)
        scales = wire[nbytes:].view(torch.float32)
        grad_at = 0 if grad is None else grad.data_ptr()
        residual_at = 0 if residual is None else residual.data_ptr()
        core.sign_encode(
            grad_at, residual_at, x.data_ptr(), n, chunk, scales.data_ptr(), wire.data_ptr(), nbytes
        )
        self._state.put(name, "residual", x)
        if plan.collective == "allgather":
            return _fused_gather_pending(wire, nbytes, n, chunk, name + ".sign", process_set)
        return self._exchange(name, wire, nbytes, _fused_decoder(n, chunk), plan, process_set)

    def _exchange(self, name, wire, nbytes, decoder, plan, process_set):
        """The pending sum of every rank's scales x signs; wire: this rank's bits (nbytes),
        then its scales."""
        bits, scales = wire[:nbytes], wire[nbytes:].view(torch.float32)
        if plan.collective != "allgather":
            return _dense_pending(decoder(bits, scales, None, False), name + ".sign", process_set)
        me = process_set.rank()

        def decode(rank, segment, out, scale, first):
            """Adds rank's scales x signs times `scale` (folded into the scales) into out."""
            rank_scales = segment[nbytes:].clone().view(torch.float32)
            folded = rank_scales if scale == 1.0 else rank_scales * scale
            # This rank's own bits are its local ones (the reference reuses their signs).
            return decoder(bits if rank == me else segment[:nbytes], folded, out, not first)

        return _gather_pending(wire, name + ".sign", process_set, decode)


def chunk_abs_means(flat, chunk):
    """Each chunk's mean magnitude (the short last chunk's over its own elements), float32,
    by the one arithmetic the core's loop computes too, so that both paths give the same
    bits (the contract: sign_kernels.cc, AbsPairwiseSum): the magnitudes summed pairwise,
    a level u of length L becoming u[:L//2] + u[L//2 : 2(L//2)] with u[L-1] appended when
    L is odd, until one is left; that sum divided by the chunk's length."""
    means = []
    for view in _chunk_views(flat, chunk):
        level = view.abs()
        while level.shape[1] > 1:
            length, half = level.shape[1], level.shape[1] // 2
            summed = level[:, :half] + level[:, half : 2 * half]
            level = torch.cat([summed, level[:, 2 * half :]], 1) if length % 2 else summed
        means.append(level[:, 0] / float(view.shape[1]))
    return torch.cat(means)


def _fused_ok(flat):
    """Whether the core's fused loops serve `flat`: a contiguous float32 CPU tensor, and a
    core built with them."""
    return (
        flat.device.type == "cpu"
        and flat.dtype == torch.float32
        and flat.is_contiguous()
        and hasattr(core, "sign_encode")
    )


def _reference_encode(flat, chunk, scales, nbytes):
    """(packed sign bits, decoder) in torch/NumPy passes; the residual left in `flat`. The
    decoder(bits, scales, out, accumulate) writes or adds scales x signs into out (a new
    tensor when None)."""
    n = flat.numel()
    bits = sign_bits(flat, nbytes)
    signs = signs_of_bits(bits, n)
    for x, sg, s in zip(
        _chunk_views(flat, chunk), _chunk_views(signs, chunk), _chunk_columns(scales, n, chunk)
    ):
        x.addcmul_(s, sg, value=-1.0)

    def decoder(rank_bits, rank_scales, out, accumulate):
        rank_signs = signs if rank_bits is bits else signs_of_bits(rank_bits, n)
        return _scaled_into(out, rank_signs, rank_scales, chunk, accumulate)

    return bits, decoder


def _fused_decoder(n, chunk):
    """The reference decoder's contract, as one pass of the core's loop per call (into a
    copy when `out` is not a contiguous float32 CPU tensor)."""

    def decoder(rank_bits, rank_scales, out, accumulate):
        if out is not None and not _fused_ok(out):  # decoded apart, then added exactly
            decoded = decoder(rank_bits, rank_scales, None, False)
            return out.view(-1).add_(decoded) if accumulate else out.view(-1).copy_(decoded)
        target = torch.empty(n, dtype=torch.float32) if out is None else out
        rank_bits, rank_scales = rank_bits.contiguous(), rank_scales.contiguous()
        core.sign_decode(
            [rank_bits.data_ptr()], [rank_scales.data_ptr()], n, chunk, target.data_ptr(), accumulate
        )
        return target

    return decoder


def _fused_gather_pending(wire, nbytes, n, chunk, name, process_set):
    """The allgather of every rank's wire (bits, then scales), decoded by one call of the
    core's loop over all ranks: the sum in rank order, the same bits as the reference's
    rank-by-rank decodes, in one pass over the result."""
    handle = mpi_ops.allgather_async(wire, name=name, process_set=process_set)

    def finish(scale=1.0, out=None):
        gathered = mpi_ops.synchronize(handle).view(process_set.size(), -1)
        scales = gathered[:, nbytes:].clone().view(torch.float32)
        if scale != 1.0:
            scales.mul_(scale)  # folded into the scales, as the reference does
        target = out if out is not None and _fused_ok(out) else torch.empty(n, dtype=torch.float32)
        bits_at, scales_at = [row.data_ptr() for row in gathered], [row.data_ptr() for row in scales]
        core.sign_decode(bits_at, scales_at, n, chunk, target.data_ptr(), False)
        return out.view(-1).copy_(target) if out is not None and target is not out else target

    return _Pending(finish)
