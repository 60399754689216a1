"""Context (sequence) parallelism: one sequence's tokens, and their attention, split over the
members of a process set (the mesh's ``cp`` axis).

- ``cp_shard(x, seq_dim, process_set, causal=False)``: this member's tokens of a full sequence
  (``hvdlite/parallel/cp.py``: contiguous blocks, or the zigzag layout for causal
  attention); ``cp_unshard`` gathers them back into the full sequence.
- ``context_parallel_attention(q, k, v, causal=False, process_set=None, mode="auto")``:
  softmax(q k^T / sqrt(d)) v over the whole sequence, from each member's local queries, keys
  and values ([batch, heads, local_tokens, head_dim]; keys and values may have fewer heads).
  Modes (see docs/parallel.md):

  ulysses    all-to-all from token shards to head shards, full attention on a share of the
             heads, all-to-all back (DeepSpeed-Ulysses). Head counts that do not divide by the
             set size are padded; GQA keys are sent as they are when both head counts divide,
             else repeated to the query heads first.
  allgather  every member gathers all keys and values (their gradient is reduce-scattered) and
             attends its own queries to them.
  ring       key/value blocks travel around the ring on point-to-point, double-buffered, merged
             by log-sum-exp in float32 (``ring.py``).
  auto       the fastest of those for the shape, measured on first use (``auto.py``).

Any sequence length works: members' blocks may differ by a token, and inside the attention they
are padded to the longest and the padding masked. Packed variable-length sequences are given
as ``cu_seqlens`` (cumulative lengths of the documents over the full sequence, the same on every
member, as flash-attention's varlen functions take them); tokens attend within their document.

Every call is collective over the set (members call it in the same order, forward and backward)
and blocks until its collectives complete. Each call first gathers every member's token count
(one small allgather) to learn the sequence length and check the layout.
"""

import math

import torch

from hvdlite.common import exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.parallel import cp as cp_layout
from hvdlite.torch import conjugate
from hvdlite.torch.parallel.cp import blocks as cp_math

MODES = ("auto", "ulysses", "allgather", "ring")


def _members(process_set, what):
    ps = global_process_set if process_set is None else process_set
    if ps.rank() < 0:
        raise exceptions.InvalidArgumentError(
            "%s: this rank is not a member of the context-parallel set %s" % (what, ps.ranks)
        )
    return ps


def cp_shard(x, seq_dim, process_set, causal=False):
    """This member's part of the full sequence `x` (the same on every member) along `seq_dim`:
    its contiguous block, or with ``causal=True`` its two zigzag chunks, concatenated. Not a
    collective. Differentiable: the gradient reaching `x` is this member's part only, so
    summing it over the set (as gradient averaging over dp x cp does) gives the whole."""
    ps = _members(process_set, "cp_shard")
    ranges = cp_layout.shard_ranges(x.shape[seq_dim], ps.size(), ps.rank(), causal)
    parts = [x.narrow(seq_dim, start, n) for start, n in ranges]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=seq_dim)


def cp_unshard(x, seq_dim, process_set, causal=False):
    """The full sequence from every member's part `x` (as cp_shard laid them out), on every
    member. Collective. Differentiable: the gradient is this member's part of the upstream
    gradient, which must be the same on every member (a loss every member computes alike)."""
    ps = _members(process_set, "cp_unshard")
    sizes = conjugate.sizes_now(x, seq_dim, None, ps)
    seq_len = cp_layout.check_lengths(sizes, causal, "cp_unshard")
    gathered = conjugate.gather_from_region(x, seq_dim, None, ps, sizes=sizes)
    if not causal:
        return gathered
    order = [p for i in range(ps.size()) for p in cp_layout.positions(seq_len, ps.size(), i, True)]
    inverse = torch.argsort(torch.tensor(order, dtype=torch.int64))
    return gathered.index_select(seq_dim, inverse.to(x.device))


class Layout:
    """One call's view of the sequence: every member's token count and global positions
    (padded with -1 to the longest), and the document of every position when packed."""

    def __init__(self, lengths, me, causal, cu_seqlens, device):
        self.seq_len = cp_layout.check_lengths(lengths, causal)
        self.members, self.me, self.causal = len(lengths), me, causal
        self.lengths, self.longest = list(lengths), max(lengths)
        self.cu_seqlens = _checked_cu_seqlens(cu_seqlens, self.seq_len, device)
        self.padded = []
        for i, n in enumerate(lengths):
            pos = cp_layout.positions(self.seq_len, self.members, i, causal) + [-1] * (self.longest - n)
            self.padded.append(torch.tensor(pos, dtype=torch.int64, device=device))

    def mask(self, qpos, kpos):
        """The [len(qpos), len(kpos)] mask of cp_math.allowed (None: nothing masked)."""
        docs = (cp_math.documents(qpos, self.cu_seqlens), cp_math.documents(kpos, self.cu_seqlens))
        return cp_math.allowed(qpos, kpos, docs[0], docs[1], self.causal)

    def pieces(self, member, padded):
        """Slices of `member`'s local rows, one per range of the full sequence it holds (two in
        the zigzag layout; empty ones left out); with `padded`, the last one reaches the longest
        member's length. Attention between pieces can be skipped where the mask hides it all."""
        out, start = [], 0
        ranges = cp_layout.shard_ranges(self.seq_len, self.members, member, self.causal)
        for i, (_, n) in enumerate(ranges):
            end = start + n + (self.longest - self.lengths[member] if padded and i == len(ranges) - 1 else 0)
            if end > start:
                out.append(slice(start, end))
            start += n
        return out

    def visible(self, src):
        """(query rows, key rows, mask) of every pair of pieces of this member's queries and
        member `src`'s padded keys that the mask does not hide entirely."""
        qpos, kpos = self.padded[self.me], self.padded[src]
        for qs in self.pieces(self.me, False):
            for ks in self.pieces(src, True):
                mask = self.mask(qpos[qs], kpos[ks])
                if mask is None or bool(mask.any()):
                    yield qs, ks, mask

    def every_position(self):
        """Every member's padded positions, in member order."""
        return torch.cat(self.padded)

    def pad(self, t):
        """`t` ([B, H, local, D]) padded with zeros to the longest member's length."""
        extra = self.longest - t.shape[2]
        return t if extra == 0 else torch.nn.functional.pad(t, (0, 0, 0, extra))


def _checked_cu_seqlens(cu_seqlens, seq_len, device):
    if cu_seqlens is None:
        return None
    cu = torch.as_tensor(cu_seqlens, dtype=torch.int64, device=device).reshape(-1)
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != seq_len or bool((cu[1:] < cu[:-1]).any()):
        raise exceptions.InvalidArgumentError(
            "context_parallel_attention: cu_seqlens %s must rise from 0 to the full sequence length %d "
            "(cumulative document lengths over the whole packed sequence, the same on every member)"
            % (cu.tolist(), seq_len)
        )
    return cu


def _check_inputs(q, k, v, mode):
    if mode not in MODES:
        raise exceptions.InvalidArgumentError(
            "context_parallel_attention: mode %r is not one of %s" % (mode, ", ".join(MODES))
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise exceptions.InvalidArgumentError(
                "context_parallel_attention: %s has shape %s; give [batch, heads, local_seq, head_dim]"
                % (name, tuple(t.shape))
            )
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise exceptions.InvalidArgumentError(
            "context_parallel_attention: q %s, k %s and v %s must agree in batch, local_seq and "
            "head_dim, and k and v in every dimension" % (tuple(q.shape), tuple(k.shape), tuple(v.shape))
        )
    if q.shape[1] % k.shape[1]:
        raise exceptions.InvalidArgumentError(
            "context_parallel_attention: q has %d heads, which is not a multiple of k's %d "
            "(grouped-query attention needs a whole number of query heads per key head)"
            % (q.shape[1], k.shape[1])
        )


def context_parallel_attention(q, k, v, causal=False, process_set=None, mode="auto", cu_seqlens=None):
    """Attention over the whole sequence from this member's local q, k, v (see the module
    docstring); returns this member's output tokens, [batch, heads, local_seq, head_dim].
    Differentiable; collective over `process_set` (default: every rank)."""
    _check_inputs(q, k, v, mode)
    ps = _members(process_set, "context_parallel_attention")
    lengths = conjugate.sizes_now(q, 2, None, ps)
    layout = Layout(lengths, ps.rank(), causal, cu_seqlens, q.device)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if ps.size() == 1:
        return local_attention(q, k, v, layout, scale)
    if mode == "auto":
        from hvdlite.torch.parallel.cp import auto as cp_auto

        mode = cp_auto.choose(q, k, v, layout, ps, scale, run_mode)
    return run_mode(mode, q, k, v, layout, ps, scale)


def run_mode(mode, q, k, v, layout, ps, scale):
    """One mode's attention (collective)."""
    if mode == "ulysses":
        return ulysses_attention(q, k, v, layout, ps, scale)
    if mode == "allgather":
        return allgather_attention(q, k, v, layout, ps, scale)
    from hvdlite.torch.parallel.cp import ring as cp_ring

    return cp_ring.ring_attention(q, k, v, layout, ps, scale)


def local_attention(q, k, v, layout, scale):
    """Every key is here already (a set of one member)."""
    pos = layout.padded[layout.me][: q.shape[2]]
    return cp_math.LocalAttention.apply(q, k, v, layout.mask(pos, pos), scale)


def allgather_attention(q, k, v, layout, ps, scale):
    """Keys and values gathered from every member (gradient: reduce-scattered sums), local
    queries attending to all of them."""
    kv = torch.cat([layout.pad(k), layout.pad(v)], dim=1)
    every = conjugate.gather_sequence(kv, None, ps, dim=2)
    k_all, v_all = every.split(k.shape[1], dim=1)
    qpos = layout.padded[layout.me][: q.shape[2]]
    return cp_math.LocalAttention.apply(q, k_all, v_all, layout.mask(qpos, layout.every_position()), scale)


def _seq_to_heads(x, ps):
    """[B, H, L, D] token shard of every head -> [B, H/P, P*L, D] every token of this member's
    heads (H divisible by P)."""
    b, h, n, d = x.shape
    p = ps.size()
    blocks = x.reshape(b, p, h // p, n, d).permute(1, 0, 2, 3, 4).contiguous()
    got = conjugate.all_to_all(blocks, None, None, ps)
    return got.reshape(p, b, h // p, n, d).permute(1, 2, 0, 3, 4).reshape(b, h // p, p * n, d)


def _heads_to_seq(y, ps):
    """The inverse of _seq_to_heads."""
    b, hp, pn, d = y.shape
    p = ps.size()
    blocks = y.reshape(b, hp, p, pn // p, d).permute(2, 0, 1, 3, 4).contiguous()
    got = conjugate.all_to_all(blocks, None, None, ps)
    return got.reshape(p, b, hp, pn // p, d).permute(1, 0, 2, 3, 4).reshape(b, p * hp, pn // p, d)


def _pad_heads(t, heads):
    extra = heads - t.shape[1]
    return t if extra == 0 else torch.cat([t, t.new_zeros(t.shape[0], extra, *t.shape[2:])], dim=1)


def ulysses_attention(q, k, v, layout, ps, scale):
    """Token shards to head shards (all-to-all), attention over every token for this member's
    heads, and back."""
    p, heads, kv_heads = ps.size(), q.shape[1], k.shape[1]
    if heads % p or kv_heads % p:
        # Key heads cannot be split like the query heads: give every query head its own key
        # head, then pad both to a multiple of the set size with zero heads (dropped after).
        k, v = cp_math.expand_heads(k, heads), cp_math.expand_heads(v, heads)
        padded = -(-heads // p) * p
        q, k, v = (_pad_heads(t, padded) for t in (q, k, v))
    qh, kh, vh = (_seq_to_heads(layout.pad(t), ps) for t in (q, k, v))
    pos = layout.every_position()
    out = cp_math.LocalAttention.apply(qh, kh, vh, layout.mask(pos, pos), scale)
    back = _heads_to_seq(out, ps)
    return back[:, :heads, : layout.lengths[layout.me]]


class ContextParallelAttention(torch.nn.Module):
    """Multi-head self-attention over a mesh's ``cp`` axis (and its ``tp`` axis, when larger
    than one: query/key/value projections column-parallel and the output projection
    row-parallel over tp, each tp member attending with its share of the heads).

    forward(x, cu_seqlens=None): x is this member's tokens, [batch, local_seq, embed_dim], laid
    out by ``cp_shard(..., causal=causal)`` over ``mesh.process_set("cp")``; returns the same
    shape. `num_kv_heads` (default num_heads) below num_heads is grouped-query attention. Every
    member of the cp (and tp) set must call it alike, forward and backward (it is collective).
    """

    def __init__(self, embed_dim, num_heads, mesh, num_kv_heads=None, causal=True, mode="auto", bias=True):
        super().__init__()
        from hvdlite.torch.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear

        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        tp = mesh.size("tp")
        if embed_dim % num_heads or num_heads % kv_heads or num_heads % tp or kv_heads % tp:
            raise exceptions.InvalidArgumentError(
                "ContextParallelAttention: embed_dim %d must divide into num_heads %d, num_heads into "
                "num_kv_heads %d groups, and both head counts by the mesh's tp size %d"
                % (embed_dim, num_heads, kv_heads, tp)
            )
        self.head_dim = embed_dim // num_heads
        self.heads, self.kv_heads = num_heads // tp, kv_heads // tp
        self.causal, self.mode = causal, mode
        self.cp_set = mesh.process_set("cp")
        tp_set = mesh.process_set("tp")
        self.q = ColumnParallelLinear(embed_dim, num_heads * self.head_dim, bias=bias, process_set=tp_set)
        self.k = ColumnParallelLinear(embed_dim, kv_heads * self.head_dim, bias=bias, process_set=tp_set)
        self.v = ColumnParallelLinear(embed_dim, kv_heads * self.head_dim, bias=bias, process_set=tp_set)
        self.out = RowParallelLinear(num_heads * self.head_dim, embed_dim, bias=bias, process_set=tp_set)

    def forward(self, x, cu_seqlens=None):
        b, n, _ = x.shape

        def heads(t, count):
            return t.reshape(b, n, count, self.head_dim).transpose(1, 2)

        q, k, v = (
            heads(self.q(x), self.heads),
            heads(self.k(x), self.kv_heads),
            heads(self.v(x), self.kv_heads),
        )
        y = context_parallel_attention(q, k, v, self.causal, self.cp_set, self.mode, cu_seqlens=cu_seqlens)
        return self.out(y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))
