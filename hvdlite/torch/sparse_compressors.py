"""``Compression.topk`` for torch gradients, and the exchange it shares with
``Compression.sign`` (hvdlite/torch/sign_compressor.py): each rank sends a sparse or 1-bit
version of (gradient + residual) through one allgather, and every rank sums the gathered
contributions in rank order, so all of them hold the same bits.
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
