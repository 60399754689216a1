"""Pooling of looked-up rows into bags for sharded embedding tables (hvdlite/torch/parallel/sparse/embedding.py):
all tables' bags by one embedding_bag, with a backward that sums each id's output gradient into
its row by one index_add instead of torch's dense embedding_bag backward (which sorts the ids
and, on CPU, took most of the pooling's time in benchmarks/sparse_embeddings.py's profile).

    pooled = pool_bags(positions, rows, offsets, mode)     # as F.embedding_bag(positions, rows, offsets, mode=mode)

`rows`: the looked-up rows (unique ids x dim); `positions`: each id's row in `rows` (1-D);
`offsets`: each bag's first position (1-D, without the closing offset); mode "sum" or "mean"
(the others take F.embedding_bag and its own backward). The gradient of `rows` is, for row r,
the sum over the ids at r of their bag's output gradient (divided by the bag's size for
"mean"), as embedding_bag's backward computes it; the sums may be added in another order
(fp32 rounding).
"""

import torch
import torch.nn.functional as F


def pool_bags(positions, rows, offsets, mode):
    if mode not in ("sum", "mean") or not torch.is_grad_enabled() or not rows.requires_grad:
        return F.embedding_bag(positions, rows, offsets, mode=mode)
    return _PoolBags.apply(rows, positions, offsets, mode)


class _PoolBags(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, positions, offsets, mode):
        ctx.save_for_backward(positions, offsets)
        ctx.mode, ctx.rows = mode, rows.shape[0]
        return F.embedding_bag(positions, rows, offsets, mode=mode)

    @staticmethod
    def backward(ctx, grad):
        positions, offsets = ctx.saved_tensors
        bags = offsets.numel()
        sizes = torch.diff(offsets, append=torch.tensor([positions.numel()], device=offsets.device))
        bag_of_id = torch.repeat_interleave(torch.arange(bags, device=offsets.device), sizes)
        if ctx.mode == "mean":  # an empty bag's output is 0 and has no ids to pass it to
            grad = grad / sizes.clamp(min=1).unsqueeze(1).to(grad.dtype)
        per_id = grad.index_select(0, bag_of_id)
        out = torch.zeros(ctx.rows, grad.shape[1], dtype=grad.dtype, device=grad.device)
        return out.index_add_(0, positions, per_id), None, None, None
