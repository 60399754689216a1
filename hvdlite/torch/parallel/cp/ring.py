"""Ring attention (mode="ring" of context_parallel_attention) on hvdlite's point-to-point.

Forward, on P members: each member keeps its queries; its keys and values (padded to the
longest member's length, K and V in one buffer) travel around the ring, member i sending to
i+1 and receiving from i-1. At step s a member holds the block of member (i - s) mod P; it
posts the send of that block and the receive of the next one before computing on it (double
buffering: transfer overlaps compute) and merges the block's partial result into its running
output by log-sum-exp in float32 (blocks.merge). It computes piece by piece (a member's two
zigzag chunks against the block's two; Layout.visible) and skips the pieces the mask hides
entirely: with the zigzag layout of causal attention every member skips about half of every
other member's block, the same share on every member.

Backward (flash-attention style, recomputing each block's scores from the saved log-sum-exp):
the key/value blocks travel the same ring again, and with each block travels the float32
accumulator of its key/value gradient: the holder adds its share and sends it on, so after P
steps every block's gradient, summed over every member's queries, is back with its owner.

Point-to-point calls are ``hvd.send_async(tensor, dst, tag, process_set)``,
``hvd.recv_async(tensor, src, tag, process_set)`` and ``hvd.synchronize(handle)`` (ranks of the
set); a send's handle completes when its buffer may be reused, and every buffer is kept alive
until its handle has completed. Matching is by (source, tag): K/V blocks use ``_KV_TAG`` and
gradient accumulators ``_GRAD_TAG``, so the two streams of the backward pass never mix.
"""

import torch

from hvdlite.common import exceptions
from hvdlite.torch import mpi_ops
from hvdlite.torch.parallel.cp import blocks as cp_math

_KV_TAG, _GRAD_TAG = 7301, 7302


def _p2p():
    import hvdlite.torch as hvd

    send, recv = getattr(hvd, "send_async", None), getattr(hvd, "recv_async", None)
    return (send, recv, mpi_ops.synchronize) if send is not None and recv is not None else None


def available():
    """Whether this build of hvdlite.torch has point-to-point (hvd.send_async / recv_async)."""
    return _p2p() is not None


def _checked_p2p():
    ops = _p2p()
    if ops is None:
        raise exceptions.NotSupportedError(
            "context_parallel_attention(mode='ring') needs hvdlite's point-to-point "
            "(hvd.send_async / hvd.recv_async), which this build lacks; use mode='ulysses' or 'allgather'"
        )
    return ops


class _Ring:
    """The neighbours and the point-to-point calls of one ring pass."""

    def __init__(self, layout, ps):
        self.send, self.recv, self.wait = _checked_p2p()
        self.ps, self.members, self.me = ps, layout.members, layout.me
        self.next, self.prev = (self.me + 1) % self.members, (self.me - 1) % self.members
        self.sends = []  # (handle, buffer): kept alive until completed

    def shift(self, block, tag):
        """Posts the send of `block` to the next member and the receive of the previous one's;
        returns (receive handle, receive buffer)."""
        self.sends.append((self.send(block, self.next, tag, self.ps), block))
        incoming = torch.empty_like(block)
        return self.recv(incoming, self.prev, tag, self.ps), incoming

    def finish(self):
        for handle, _ in self.sends:
            self.wait(handle)
        self.sends.clear()


def _kv_block(k, v, layout):
    return torch.cat([layout.pad(k), layout.pad(v)], dim=1).contiguous()


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, ps, scale):
        ring = _Ring(layout, ps)
        heads, kv_heads = q.shape[1], k.shape[1]
        qf = q.float()
        out = qf.new_zeros(q.shape)
        lse = qf.new_full(q.shape[:3], cp_math.NEG_INF)
        block = _kv_block(k, v, layout)
        for step in range(ring.members):
            last = step == ring.members - 1
            pending = None if last else ring.shift(block, _KV_TAG)
            pairs = list(layout.visible((ring.me - step) % ring.members))
            if pairs:
                kb, vb = (cp_math.expand_heads(t, heads).float() for t in block.split(kv_heads, dim=1))
            for qs, ks, mask in pairs:
                part = cp_math.block_forward(qf[:, :, qs], kb[:, :, ks], vb[:, :, ks], mask, scale)
                out[:, :, qs], lse[:, :, qs] = cp_math.merge(out[:, :, qs], lse[:, :, qs], *part)
            if pending is not None:
                ring.wait(pending[0])
                block = pending[1]
        ring.finish()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.ps, ctx.scale = layout, ps, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        layout, scale = ctx.layout, ctx.scale
        ring = _Ring(layout, ctx.ps)
        heads, kv_heads = q.shape[1], k.shape[1]
        qf = q.float()
        dout = dout.float()
        delta = (dout * out).sum(dim=-1)
        dq = torch.zeros_like(qf)
        block = _kv_block(k, v, layout)
        grad_in: tuple[object, torch.Tensor] | None = (
            None  # the receive of the accumulator for the block held next
        )
        for step in range(ring.members):
            last = step == ring.members - 1
            pending = None if last else ring.shift(block, _KV_TAG)
            pairs = list(layout.visible((ring.me - step) % ring.members))
            share = block.new_zeros(block.shape, dtype=torch.float32)
            if pairs:
                kb, vb = (cp_math.expand_heads(t, heads).float() for t in block.split(kv_heads, dim=1))
                dk, dv = torch.zeros_like(kb), torch.zeros_like(vb)
                for qs, ks, mask in pairs:
                    dq_b, dk_b, dv_b = cp_math.block_backward(
                        qf[:, :, qs],
                        kb[:, :, ks],
                        vb[:, :, ks],
                        mask,
                        scale,
                        dout[:, :, qs],
                        lse[:, :, qs],
                        delta[:, :, qs],
                    )
                    dq[:, :, qs] += dq_b
                    dk[:, :, ks] += dk_b
                    dv[:, :, ks] += dv_b
                share = torch.cat([cp_math.fold_heads(dk, kv_heads), cp_math.fold_heads(dv, kv_heads)], dim=1)
            if grad_in is not None:
                ring.wait(grad_in[0])
                share = share + grad_in[1]
            grad_in = ring.shift(share.contiguous(), _GRAD_TAG)
            if pending is not None:
                ring.wait(pending[0])
                block = pending[1]
        assert grad_in is not None  # set at every step, and there is at least one
        ring.wait(grad_in[0])
        ring.finish()
        own = grad_in[1]  # this member's block, after every member added its share
        n = k.shape[2]
        dk, dv = own[:, :kv_heads, :n], own[:, kv_heads:, :n]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def ring_attention(q, k, v, layout, ps, scale):
    """Ring attention of this member's q, k, v (see the module docstring); differentiable."""
    _checked_p2p()
    return RingAttention.apply(q, k, v, layout, ps, scale)
