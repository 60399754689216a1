"""``Compression.topk`` and ``Compression.sign`` for torch gradients: each rank sends a
sparse or 1-bit version of (gradient + residual) through one allgather, and every rank
sums the gathered contributions in rank order, so all of them hold the same bits.
Past the allgather's crossover in ranks (hvdlite/common/compressors.py, gather_wins)
the same contribution travels densified through an allreduce instead. Contracts as in
hvdlite/torch/compressors.py.
"""

from typing import Any

import numpy as np
import torch

from hvdlite.common import compressors as policy
from hvdlite.common import dtypes, exceptions
from hvdlite.common.native import core
from hvdlite.torch import mpi_ops
from hvdlite.torch.compressors import StatefulCompressor, _Pending

_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)
# Row b: the 8 elements a byte b of packed sign bits stands for, +1.0 where a bit is 0 and
# -1.0 where it is 1 (bit i of byte j = element 8 j + i).
_SIGN_TABLE_NP = np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little"), -1.0, 1.0
).astype(np.float32)
_SIGN_TABLE = torch.from_numpy(_SIGN_TABLE_NP)


def _dense_pending(contribution, name, process_set):
    """The contribution (already what this rank sends) summed by an allreduce."""
    handle = mpi_ops.allreduce_async_(contribution, name=name, op=dtypes.Sum, process_set=process_set)

    def finish(scale=1.0, out=None):
        result = mpi_ops.synchronize(handle)
        if out is None:
            return result if scale == 1.0 else result.mul_(scale)
        return torch.mul(result, scale, out=out)

    return _Pending(finish)


def _gather_pending(wire, name, process_set, decode):
    """An allgather of every rank's `wire`; decode(rank, segment, out, scale) adds rank's
    contribution times `scale` into out (None before the first rank: decode then writes
    into the caller's `out` where given, else a new tensor), called in rank order."""
    handle = mpi_ops.allgather_async(wire, name=name, process_set=process_set)

    def finish(scale=1.0, out=None):
        gathered = mpi_ops.synchronize(handle).view(process_set.size(), -1)
        for rank, segment in enumerate(gathered):
            out = decode(rank, segment, out, scale, rank == 0)
        return out

    return _Pending(finish)


def _sampled_threshold(magnitude, k, generator):
    """A threshold that about 1.3 k (at least k, most of the time) magnitudes reach,
    from a random sample of them instead of a sort; None when a sample would not be
    much smaller than the tensor."""
    n = magnitude.numel()
    samples = min(n, -(-64 * n // k))
    if 2 * samples > n:
        return None
    picks = torch.randint(n, (samples,), generator=generator).to(magnitude.device)
    position = min(samples, int(1.3 * k * samples / n) + 2)
    return torch.topk(magnitude[picks], position, sorted=False).values.min()


def _at_least(magnitude, threshold):
    """Indices (int64) of the magnitudes >= threshold. On the CPU through NumPy: torch's
    nonzero takes 6x as long (3 ms against 0.5 per 1M elements here)."""
    if magnitude.device.type != "cpu":
        return torch.nonzero(magnitude >= threshold).view(-1)
    values = magnitude.numpy()
    return torch.from_numpy(np.flatnonzero(values >= values.dtype.type(threshold.item())))


def select_topk(magnitude, k, generator):
    """Indices of the k largest magnitudes (ties broken arbitrarily): the candidates
    above a sampled threshold, then an exact top-k among them; a full top-k when the
    sample misjudged (fewer than k candidates)."""
    threshold = _sampled_threshold(magnitude, k, generator)
    if threshold is not None:
        candidates = _at_least(magnitude, threshold)
        if candidates.numel() >= k:
            return candidates[_largest(magnitude[candidates], k)]
    return _largest(magnitude, k)


def _largest(values, k):
    """Indices of the k largest of 1-D `values`, in no order (ties broken arbitrarily). On
    the CPU NumPy's introselect: torch.topk sorts when k is close to the length (5x slower
    on the ~1.3 k candidates)."""
    if values.device.type != "cpu":
        return torch.topk(values, k, sorted=False).indices
    n = values.numel()
    return torch.from_numpy(np.argpartition(values.numpy(), n - k)[n - k :])


class _FusedBucket:
    """One step's gradients for a fused top-k: filled by start() in hook order, closed by
    the first advance() (in synchronize), which selects across all of them, sorted by
    name (the same order on every rank), and submits one collective."""

    def __init__(self, compressor, process_set):
        self.compressor = compressor
        self.process_set = process_set
        self.entries = {}
        self.pending: Any = None
        self.outputs = None

    def advance(self):
        if self.pending is None:
            self.pending = self.compressor._fused_start(self)

    def output(self, name, scale=1.0, out=None):
        """Gradient `name`'s part of the step's output (a view; `out` is not written)."""
        self.advance()
        if self.outputs is None:  # the scale is the same for every gradient of the step
            out, self.outputs, offset = self.pending(scale), {}, 0
            for entry_name in sorted(self.entries):
                numel = self.entries[entry_name].numel()
                self.outputs[entry_name] = out[offset : offset + numel]
                offset += numel
        return self.outputs[name]


class TopKCompressor(StatefulCompressor):
    """Top-k sparsification with error feedback: each rank sends the k = ratio x numel
    entries of largest magnitude of (gradient + residual) as int32 indices and float32
    values, and keeps the rest as its residual. With momentum > 0, momentum correction as
    in DGC (Lin et al., 2018): the compressor accumulates velocity u = momentum u + g and
    sends from residual + u, clearing both where it sent; use it with a momentum-free
    optimizer then. With fused=True the k entries are chosen across all compressed
    gradients of a step together (one collective per step, started in step() rather than
    during backward), so a layer with larger gradients gets more of them."""

    method = "topk"

    def __init__(
        self,
        ratio=0.01,
        momentum=0.0,
        min_numel=policy.DEFAULT_MIN_NUMEL,
        fused=False,
        seed=0,
        cross_host_only=None,
    ):
        super().__init__(min_numel, cross_host_only)
        self.ratio = policy.check_ratio(ratio)
        self.momentum = policy.check_momentum(momentum)
        self.fused = bool(fused)
        self._generator = torch.Generator().manual_seed(seed)
        self._bucket: Any = None

    def _describe(self):
        return "ratio=%g, momentum=%g, min_numel=%d, fused=%s" % (
            self.ratio,
            self.momentum,
            self.min_numel,
            self.fused,
        )

    def _plan(self, shape, is_float, itemsize, size):
        return policy.topk_plan(shape, is_float, itemsize, self.ratio, size, self.min_numel)

    def load_state_dict(self, state):
        self._bucket = None  # a step in flight is abandoned with its handles
        super().load_state_dict(state)

    def _corrected(self, name, grad):
        if self.momentum == 0.0:
            return super()._corrected(name, grad)
        local = self._state.local_of(name)
        velocity = grad.to(torch.float32, copy=True).contiguous()
        if "velocity" in local:
            velocity.add_(local["velocity"].to(velocity.device), alpha=self.momentum)
        local["velocity"] = velocity
        residual = local.get("residual")
        return velocity.clone() if residual is None else velocity + residual.to(velocity.device)

    def _select(self, flat, pieces):
        """Top-k of `flat`, which concatenates `pieces` ([(name, shape)]); keeps each
        piece's unsent part as its residual (and clears the sent part of its velocity).
        Returns (index, values)."""
        index = select_topk(flat.abs(), policy.topk_count(flat.numel(), self.ratio), self._generator)
        values = flat[index]
        residual = flat  # the compressor's own new tensor (_corrected, or the fused concatenation)
        residual[index] = 0.0
        velocity = None
        if self.momentum != 0.0:
            velocity = torch.cat([self._state.local_of(n)["velocity"].view(-1) for n, _ in pieces])
            velocity[index] = 0.0
        offset = 0
        for name, shape in pieces:
            local, numel = self._state.local_of(name), int(torch.Size(shape).numel())
            # Views of this step's new tensors (never mutated later: the state is replaced).
            local["residual"] = residual[offset : offset + numel].view(shape)
            if velocity is not None:
                local["velocity"] = velocity[offset : offset + numel].view(shape)
            offset += numel
        return index, values

    def _exchange(self, like, index, values, gather, name, process_set):
        """The ranks' (index, values) summed into a dense tensor shaped as flat `like`."""
        if not gather:
            dense = torch.zeros_like(like)
            dense[index] = values
            return _dense_pending(dense, name, process_set)
        k = index.numel()
        wire = torch.cat([index.to(torch.int32), values.view(torch.int32)])

        def decode(rank, segment, out, scale, first):
            if first:
                out = torch.zeros_like(like) if out is None else out.zero_()
            # Indices within one rank are distinct: one addition per entry, in rank order.
            return out.index_add_(0, segment[:k].long(), segment[k:].view(torch.float32) * scale)

        return _gather_pending(wire, name, process_set, decode)

    def _start(self, name, corrected, plan, process_set):
        if self.fused:
            if self._bucket is None or self._bucket.pending is not None:
                self._bucket = _FusedBucket(self, process_set)
            bucket = self._bucket
            bucket.entries[name] = corrected
            return _Pending(lambda scale=1.0, out=None: bucket.output(name, scale), bucket.advance)
        flat = corrected.view(-1)
        index, values = self._select(flat, [(name, corrected.shape)])
        gather = plan.collective == "allgather"
        return self._exchange(flat, index, values, gather, name + ".topk", process_set)

    def _fused_start(self, bucket):
        names = sorted(bucket.entries)
        devices = {bucket.entries[n].device for n in names}
        if len(devices) > 1:
            raise exceptions.NotSupportedError(
                "Compression.topk(fused=True) needs every compressed gradient on one device; got %s"
                " (use fused=False)" % sorted(str(d) for d in devices)
            )
        flat = torch.cat([bucket.entries[n].view(-1) for n in names])
        index, values = self._select(flat, [(n, bucket.entries[n].shape) for n in names])
        size = bucket.process_set.size()
        gather = policy.gather_wins(8 * index.numel(), 4 * flat.numel(), size)
        tag = "%s.topk.fused%d" % (names[0], len(names))
        return self._exchange(flat, index, values, gather, tag, bucket.process_set)


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

    def _start(self, name, corrected, plan, process_set):
        flat = corrected.view(-1)
        chunk, _ = policy.sign_layout(tuple(corrected.shape), self.chunk)
        # Each chunk's mean magnitude (the short last chunk's over its own elements).
        scales = torch.cat([v.abs().mean(1) for v in _chunk_views(flat, chunk)])
        nbytes = 4 * (-(-flat.numel() // 32))
        fused = _fused_ok(flat)
        # flat is the compressor's own new tensor: the residual x - copysign(scale, x) is
        # computed in place, in the same pass that packs the bits where the core's fused
        # loop serves (sign_kernels.cc), else from the decoded signs (the reference).
        if fused:
            bits = torch.empty(nbytes, dtype=torch.uint8)
            core.sign_encode(flat.data_ptr(), flat.numel(), chunk, scales.data_ptr(), bits.data_ptr(), nbytes)
            decoder = _fused_decoder(flat.numel(), chunk)
        else:
            bits, decoder = _reference_encode(flat, chunk, scales, nbytes)
        self._state.local_of(name)["residual"] = flat.view(corrected.shape)
        if plan.collective != "allgather":
            return _dense_pending(decoder(bits, scales, None, False), name + ".sign", process_set)
        wire = torch.cat([bits, scales.view(torch.uint8)])
        me = process_set.rank()

        def decode(rank, segment, out, scale, first):
            """Adds rank's scales x signs times `scale` (folded into the scales) into out."""
            rank_scales = segment[nbytes:].clone().view(torch.float32)
            folded = rank_scales if scale == 1.0 else rank_scales * scale
            # This rank's own bits are its local ones (the reference reuses their signs).
            return decoder(bits if rank == me else segment[:nbytes], folded, out, not first)

        return _gather_pending(wire, name + ".sign", process_set, decode)


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
            rank_bits.data_ptr(), n, chunk, rank_scales.data_ptr(), target.data_ptr(), accumulate
        )
        return target

    return decoder
