"""The attention arithmetic of context parallelism, on one rank: a block of queries against a
block of keys under an explicit mask, the log-sum-exp merge of partial results, and the
flash-attention backward of one block. Every context-parallel mode is built from these, so all
modes compute the same numbers.

Tensors are [batch, heads, tokens, head_dim]; keys and values may have fewer heads than the
queries (grouped-query attention: query head h uses key head h // (heads / kv_heads), as
torch's scaled_dot_product_attention(enable_gqa=True) does). The arithmetic runs in float32
whatever the input dtype (the log-sum-exp merge must), and results are cast back.

Masks come from token positions: a query at global position p may see a key at position s when
s is a real token (s >= 0; padding is -1), both are in the same packed document (when
cu_seqlens is given) and, if causal, s <= p. A padding query sees every real key, so that no
row is empty where it would make NaNs; its output is thrown away by the caller.
"""

import torch

NEG_INF = float("-inf")


def documents(pos, cu_seqlens):
    """The packed document of each position (positions < 0 give -1), or None without packing."""
    if cu_seqlens is None:
        return None
    doc = torch.searchsorted(cu_seqlens, pos.clamp(min=0), right=True) - 1
    return doc.masked_fill(pos < 0, -1)


def allowed(qpos, kpos, qdoc, kdoc, causal):
    """[Lq, Lk] bool: which key each query may see (see the module docstring); None when every
    query may see every key (no mask needed)."""
    real_k = kpos >= 0
    ok = real_k.unsqueeze(0).expand(qpos.shape[0], kpos.shape[0])
    if causal:
        ok = ok & (kpos.unsqueeze(0) <= qpos.unsqueeze(1))
    if qdoc is not None:
        ok = ok & (qdoc.unsqueeze(1) == kdoc.unsqueeze(0))
    pad_q = qpos < 0
    if bool(pad_q.any()):
        ok = torch.where(pad_q.unsqueeze(1), real_k.unsqueeze(0), ok)
    if bool(ok.all()):
        return None
    return ok


def expand_heads(t, heads):
    """Key/value heads repeated to match `heads` query heads (GQA)."""
    group = heads // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def fold_heads(grad, kv_heads):
    """The gradient of ``expand_heads``: each key head's copies summed."""
    b, h, n, d = grad.shape
    group = h // kv_heads
    return grad if group == 1 else grad.reshape(b, kv_heads, group, n, d).sum(dim=2)


def _safe(lse):
    """lse with -inf (rows that saw no key) replaced by 0, for subtracting without NaNs."""
    return lse.masked_fill(torch.isinf(lse), 0.0)


def _scores(q, k, mask, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    return s if mask is None else s.masked_fill(~mask, NEG_INF)


def block_forward(q, k, v, mask, scale):
    """(out, lse) of float32 queries against one block of float32 keys/values with the same
    number of heads: out is softmax-normalised within the block, lse [B, H, Lq] its log-sum-exp
    (-inf for rows that see no key of the block, whose out is 0)."""
    s = _scores(q, k, mask, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - _safe(lse).unsqueeze(-1))
    return torch.matmul(p, v), lse


def merge(out, lse, block_out, block_lse):
    """Two partial results over disjoint key sets combined into the result over both (the
    log-sum-exp merge, float32)."""
    total = torch.logaddexp(lse, block_lse)
    safe = _safe(total).unsqueeze(-1)
    merged = out * torch.exp(lse.unsqueeze(-1) - safe) + block_out * torch.exp(block_lse.unsqueeze(-1) - safe)
    return merged, total


def block_backward(q, k, v, mask, scale, dout, lse, delta):
    """(dq, dk, dv) of one block's share of the attention, given the final lse and
    delta = rowsum(dout * out) of the whole row (the flash-attention backward); float32,
    keys/values with the queries' head count."""
    s = _scores(q, k, mask, scale)
    p = torch.exp(s - _safe(lse).unsqueeze(-1))
    dv = torch.matmul(p.transpose(-1, -2), dout)
    dp = torch.matmul(dout, v.transpose(-1, -2))
    ds = p * (dp - delta.unsqueeze(-1))
    dq = torch.matmul(ds, k) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale
    return dq, dk, dv


# Query rows per piece in LocalAttention: at most this many score elements live at once.
_SCORE_ELEMENTS = 1 << 24


def _row_pieces(q, keys):
    """Slices of query rows such that one piece's scores stay under _SCORE_ELEMENTS."""
    b, h, n, _ = q.shape
    step = max(1, _SCORE_ELEMENTS // max(1, b * h * keys))
    return [slice(i, min(n, i + step)) for i in range(0, n, step)]


def _rows(mask, piece):
    return None if mask is None else mask[piece]


class LocalAttention(torch.autograd.Function):
    """Attention of local queries against keys/values all present on this rank (after a gather
    or an all-to-all), with a mask; saves only its inputs, output and lse (no scores), and
    computes in pieces of query rows so that its transient scores stay bounded too."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        heads = q.shape[1]
        qf, kf, vf = q.float(), expand_heads(k, heads).float(), expand_heads(v, heads).float()
        pieces = _row_pieces(q, k.shape[2])
        parts = [block_forward(qf[:, :, p], kf, vf, _rows(mask, p), scale) for p in pieces]
        out, lse = torch.cat([o for o, _ in parts], dim=2), torch.cat([s for _, s in parts], dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.scale = mask, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        heads, kv_heads = q.shape[1], k.shape[1]
        dout = dout.float()
        delta = (dout * out).sum(dim=-1)
        qf, kf, vf = q.float(), expand_heads(k, heads).float(), expand_heads(v, heads).float()
        dq, dk, dv = torch.empty_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        for p in _row_pieces(q, k.shape[2]):
            dq[:, :, p], dk_p, dv_p = block_backward(
                qf[:, :, p],
                kf,
                vf,
                _rows(ctx.mask, p),
                ctx.scale,
                dout[:, :, p],
                lse[:, :, p],
                delta[:, :, p],
            )
            dk += dk_p
            dv += dv_p
        return (
            dq.to(q.dtype),
            fold_heads(dk, kv_heads).to(k.dtype),
            fold_heads(dv, kv_heads).to(v.dtype),
            None,
            None,
        )
