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
from hvdlite.torch import mpi_ops
from hvdlite.torch.compressors import StatefulCompressor, _Pending

_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)


def _dense_pending(contribution, name, process_set):
    """The contribution (already what this rank sends) summed by an allreduce."""
    handle = mpi_ops.allreduce_async_(contribution, name=name, op=dtypes.Sum, process_set=process_set)

    def finish(scale=1.0):
        out = mpi_ops.synchronize(handle)
        return out if scale == 1.0 else out.mul_(scale)

    return _Pending(finish)


def _gather_pending(wire, name, process_set, decode):
    """An allgather of every rank's `wire`; decode(rank, segment, out, scale) adds rank's
    contribution times `scale` into out, called in rank order."""
    handle = mpi_ops.allgather_async(wire, name=name, process_set=process_set)

    def finish(scale=1.0):
        gathered = mpi_ops.synchronize(handle).view(process_set.size(), -1)
        out = None
        for rank, segment in enumerate(gathered):
            out = decode(rank, segment, out, scale)
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


def select_topk(magnitude, k, generator):
    """Indices of the k largest magnitudes (ties broken arbitrarily): the candidates
    above a sampled threshold, then an exact top-k among them; a full top-k when the
    sample misjudged (fewer than k candidates)."""
    threshold = _sampled_threshold(magnitude, k, generator)
    if threshold is not None:
        candidates = torch.nonzero(magnitude >= threshold).view(-1)
        if candidates.numel() >= k:
            chosen = torch.topk(magnitude[candidates], k, sorted=False).indices
            return candidates[chosen]
    return torch.topk(magnitude, k, sorted=False).indices


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

    def output(self, name, scale=1.0):
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

        def decode(rank, segment, out, scale):
            if out is None:
                out = torch.zeros_like(like)
            # Indices within one rank are distinct: one addition per entry, in rank order.
            return out.index_add_(0, segment[:k].long(), segment[k:].view(torch.float32) * scale)

        return _gather_pending(wire, name, process_set, decode)

    def _start(self, name, corrected, plan, process_set):
        if self.fused:
            if self._bucket is None or self._bucket.pending is not None:
                self._bucket = _FusedBucket(self, process_set)
            bucket = self._bucket
            bucket.entries[name] = corrected
            return _Pending(lambda scale=1.0: bucket.output(name, scale), bucket.advance)
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


def pack_bits(bits, nbytes):
    """A bool tensor as `nbytes` uint8, bit i of byte j = element 8 j + i (NumPy's
    packbits on the CPU, 50x faster than the torch arithmetic used on other devices)."""
    if bits.device.type != "cpu":
        return _pack_bits_torch(bits, nbytes)
    packed = np.packbits(bits.view(-1).numpy(), bitorder="little")
    out = torch.zeros(nbytes, dtype=torch.uint8)
    out[: packed.size] = torch.from_numpy(packed)
    return out


def unpack_bits(packed, n):
    """pack_bits' inverse: the first n bits, as uint8 0 or 1."""
    if packed.device.type != "cpu":
        return _unpack_bits_torch(packed, n)
    return torch.from_numpy(np.unpackbits(packed.numpy(), count=n, bitorder="little"))


def _pad(flat, length):
    if flat.numel() == length:
        return flat
    out = torch.zeros(length, dtype=flat.dtype, device=flat.device)
    out[: flat.numel()] = flat
    return out


def _scaled_signs(signed, scales, chunk, n):
    """Each chunk's scale with the sign of `signed` (float32: n values whose sign bits are
    what is sent; -0.0 counts as negative), one copysign pass; float32, n values."""
    chunks = scales.numel()
    grid = _pad(signed, chunks * chunk).view(chunks, chunk)
    return torch.copysign(scales.view(-1, 1).expand(chunks, chunk), grid).view(-1)[:n]


def _signs_of_bits(negative, n):
    """+1.0 where a sent bit is 0, -1.0 where it is 1 (float32)."""
    return torch.sub(1.0, negative[:n].to(torch.float32), alpha=2.0)


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
        n = flat.numel()
        chunk, chunks = policy.sign_layout(tuple(corrected.shape), self.chunk)
        if chunks * chunk == n:
            scales = flat.view(chunks, chunk).abs().mean(1)
        else:  # the last chunk is short: its mean over its own elements
            sums = torch.zeros(chunks * chunk, dtype=torch.float32, device=flat.device)
            sums[:n] = flat.abs()
            counts = torch.full((chunks,), float(chunk), device=flat.device)
            counts[-1] = n - (chunks - 1) * chunk
            scales = sums.view(chunks, chunk).sum(1) / counts
        negative = torch.signbit(flat)  # what copysign reads: -0.0 is negative too
        sent = _scaled_signs(flat, scales, chunk, n)
        # flat is the compressor's own new tensor: the residual is computed in place.
        self._state.local_of(name)["residual"] = flat.sub_(sent).view(corrected.shape)
        if plan.collective != "allgather":
            return _dense_pending(sent, name + ".sign", process_set)
        nbytes = 4 * (-(-n // 32))
        wire = torch.cat([pack_bits(negative, nbytes), scales.view(torch.uint8)])
        me, last = process_set.rank(), process_set.size() - 1

        def decode(rank, segment, out, scale):
            if rank == me:  # this rank's own contribution is `sent` (the same bits, the same values)
                contribution = sent
            else:
                rank_scales = segment[nbytes:].clone().view(torch.float32)
                signs = _signs_of_bits(unpack_bits(segment[:nbytes], n), n)
                contribution = _scaled_signs(signs, rank_scales, chunk, n)
            out = contribution if out is None else out.add_(contribution)
            return out.mul_(scale) if rank == last and scale != 1.0 else out

        return _gather_pending(wire, name + ".sign", process_set, decode)
