"""The conjugate collectives of tensor parallelism, as autograd Functions over hvdlite.torch's
public (non-differentiable) collectives on the tensor-parallel process set:

  copy_to_region        identity            | allreduce(Sum) of the gradient
  reduce_from_region    allreduce(Sum)      | identity
  gather_from_region    allgather(dim)      | this member's slice of the gradient
  scatter_to_region     this member's slice | allgather(dim) of the gradient
  gather_sequence       allgather(dim 0)    | reducescatter(Sum) of the gradient (dim 0)
  reduce_scatter_sequence reducescatter(Sum, dim 0) | allgather(dim 0)

Every member of the set must call the same functions in the same order, forward and
backward (they are collectives); each call blocks until its collective completes. Sizes that
do not divide evenly are split as reducescatter splits rows: the first (n % size) members
get one extra (``partition``).
"""

import torch

from hvdlite.common import dtypes
from hvdlite.torch import mpi_ops


def partition(n, parts, index):
    """(start, length) of member `index`'s block when n items are split over `parts` members,
    the first n % parts members taking one extra (reducescatter's split)."""
    base, extra = divmod(n, parts)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def _sum(t, name, ps):
    return mpi_ops.synchronize(
        mpi_ops.allreduce_async(t.contiguous(), name=name, op=dtypes.Sum, process_set=ps)
    )


def allreduce_max(t, name, ps):
    """Elementwise maximum over the set (not differentiable)."""
    return mpi_ops.synchronize(
        mpi_ops.allreduce_async(t.detach().contiguous(), name=name, op=dtypes.Max, process_set=ps)
    )


def _gather(t, dim, name, ps):
    moved = t.movedim(dim, 0).contiguous()
    out = mpi_ops.synchronize(mpi_ops.allgather_async(moved, name=name, process_set=ps))
    return out.movedim(0, dim)


def _slice(t, dim, ps):
    start, length = partition(t.shape[dim], ps.size(), ps.rank())
    return t.narrow(dim, start, length).contiguous()


def _reduce_scatter(t, name, ps):
    return mpi_ops.synchronize(
        mpi_ops.reducescatter_async(t.contiguous(), name=name, op=dtypes.Sum, process_set=ps)
    )


def _slice_of_gathered(t, dim, rows, ps):
    """This member's block of a tensor gathered along `dim` from blocks of `rows` each."""
    me = ps.rank()
    return t.narrow(dim, sum(rows[:me]), rows[me]).contiguous()


def _rows(local, dim, name, ps):
    n = torch.tensor([local.shape[dim]], dtype=torch.int64)
    return mpi_ops.synchronize(mpi_ops.allgather_async(n, name=name, process_set=ps)).tolist()


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name, ps):
        ctx.name, ctx.ps = name, ps
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum(grad, ctx.name + ".bwd", ctx.ps), None, None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name, ps):
        return _sum(x, name, ps)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, name, ps, rows):
        ctx.dim, ctx.ps = dim, ps
        ctx.rows = rows if rows is not None else _rows(x, dim, name + ".rows", ps)
        return _gather(x, dim, name, ps)

    @staticmethod
    def backward(ctx, grad):
        return _slice_of_gathered(grad, ctx.dim, ctx.rows, ctx.ps), None, None, None, None


class _ScatterToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, name, ps):
        ctx.dim, ctx.name, ctx.ps = dim, name, ps
        return _slice(x, dim, ps)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.dim, ctx.name + ".bwd", ctx.ps), None, None, None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name, ps):
        ctx.name, ctx.ps = name, ps
        return _gather(x, 0, name, ps)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.name + ".bwd", ctx.ps), None, None


class _ReduceScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name, ps):
        ctx.name, ctx.ps = name, ps
        return _reduce_scatter(x, name, ps)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, 0, ctx.name + ".bwd", ctx.ps), None, None


def copy_to_region(x, name, process_set):
    """Identity forward; the gradient is summed over the set (entering a parallel region)."""
    return _CopyToRegion.apply(x, name, process_set)


def reduce_from_region(x, name, process_set):
    """Sum over the set forward; identity backward (leaving a row-parallel region)."""
    return _ReduceFromRegion.apply(x, name, process_set)


def gather_from_region(x, dim, name, process_set, rows=None):
    """Concatenation of every member's block along `dim` (blocks may differ in size; `rows`,
    each member's block size, saves a collective when the caller knows them). The gradient
    is this member's block of the upstream gradient (which must be the same on every member)."""
    return _GatherFromRegion.apply(x, dim, name, process_set, rows)


def scatter_to_region(x, dim, name, process_set):
    """This member's block of `x` along `dim` (``partition``); gradient gathered."""
    return _ScatterToRegion.apply(x, dim, name, process_set)


def gather_sequence(x, name, process_set):
    """Sequence-parallel to full: allgather along dim 0; gradient reduce-scattered (Sum)."""
    return _GatherSequence.apply(x, name, process_set)


def reduce_scatter_sequence(x, name, process_set):
    """Partial sums to sequence-parallel: reducescatter(Sum) along dim 0; gradient gathered."""
    return _ReduceScatterSequence.apply(x, name, process_set)


def scatter_sequence(x, name, process_set):
    """Full to sequence-parallel (this member's rows of dim 0); gradient gathered."""
    return _ScatterToRegion.apply(x, 0, name, process_set)
