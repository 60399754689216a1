"""Differentiable collectives: allreduce, grouped_allreduce, allgather,
grouped_allgather, broadcast, alltoall, reducescatter, grouped_reducescatter.

Each is a torch.autograd.Function whose backward runs the collective that
Horovod defines as its gradient (the rules are in hvdlite.common.gradients).
Every member must run the backward pass too, in the same order, since the
backward collectives are collective.
"""

import torch

from hvdlite.common import dtypes, gradients
from hvdlite.common.process_sets import global_process_set
from hvdlite.common.reduction import resolve_op
from hvdlite.torch import mpi_ops
from hvdlite.torch.compression import Compression


class HorovodAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return mpi_ops.synchronize(
            mpi_ops.allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        )

    @staticmethod
    def backward(ctx, grad_output):
        average, op, prescale, postscale, process_set = ctx.args
        grad = allreduce(
            grad_output,
            average=average,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )
        return grad, None, None, None, None, None, None


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Returns a new tensor: `tensor` reduced (default: averaged) across the
    process set, optionally compressed on the wire. Differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(
        compressed, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(reduced, ctx)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return tuple(
            mpi_ops.synchronize(
                mpi_ops.grouped_allreduce_async(
                    list(tensors), average, name, op, prescale_factor, postscale_factor, process_set
                )
            )
        )

    @staticmethod
    def backward(ctx, *grad_outputs):
        average, op, prescale, postscale, process_set = ctx.args
        grads = grouped_allreduce(
            list(grad_outputs),
            average=average,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )
        return (None,) * 6 + tuple(grads)


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """allreduce of a list of tensors as one group; returns the list. Differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(
        average, name, op, prescale_factor, postscale_factor, process_set, *[p[0] for p in pairs]
    )
    return [compression.decompress(t, p[1]) for t, p in zip(reduced, pairs)]


def _rows_of_members(rows, process_set):
    """Every member's first-dimension sizes (one list per tensor), gathered."""
    mine = torch.tensor([rows], dtype=torch.int64)
    return mpi_ops.synchronize(mpi_ops.allgather_async(mine, process_set=process_set))


def _allgather_grads(grad_outputs, rows, process_set):
    """Horovod's allgather gradient for each tensor: the averaged upstream
    gradient, restricted to this member's rows."""
    reduced = grouped_allreduce(list(grad_outputs), op=gradients.ALLGATHER_GRAD_OP, process_set=process_set)
    table = _rows_of_members(rows, process_set)
    me = process_set.rank()
    grads = []
    for i, grad in enumerate(reduced):
        offset, count = gradients.allgather_grad_slice(table[:, i].tolist(), me)
        grads.append(grad.narrow(0, offset, count))
    return grads


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = [tensor.shape[0] if tensor.dim() else 1]
        ctx.process_set = process_set
        return mpi_ops.synchronize(mpi_ops.allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return _allgather_grads([grad_output], ctx.rows, ctx.process_set)[0], None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenation of every member's `tensor` along dim 0 (first dims may
    differ). Differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [t.shape[0] if t.dim() else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(mpi_ops.synchronize(mpi_ops.grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None) + tuple(_allgather_grads(grad_outputs, ctx.rows, ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return mpi_ops.synchronize(mpi_ops.broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        from hvdlite.common.basics import rank

        grad = allreduce(grad_output, op=gradients.BROADCAST_GRAD_OP, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad = torch.zeros_like(grad)
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's `tensor` (root_rank is a global rank), as a new tensor. Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = mpi_ops.synchronize(mpi_ops.alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_received):
        grad, _ = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` to member i (an even split without
    splits). Returns the received tensor, and with splits also the rows
    received from each member (int32 tensor). Differentiable."""
    output, received = HorovodAlltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def _reducescatter_grad(grad_outputs, op, prescale, postscale, process_set):
    scale = gradients.reducescatter_grad_scale(op, prescale, postscale, process_set.size())
    scaled = [g * scale if scale != 1.0 else g for g in grad_outputs]
    return grouped_allgather(scaled, process_set=process_set)


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return mpi_ops.synchronize(
            mpi_ops.reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor)
        )

    @staticmethod
    def backward(ctx, grad_output):
        return (_reducescatter_grad([grad_output], *ctx.args)[0],) + (None,) * 5


def reducescatter(
    tensor,
    name=None,
    compression=Compression.none,
    op=dtypes.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """This member's block of rows of `tensor` reduced across members. Differentiable."""
    op = resolve_op(op, None)
    compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(
            mpi_ops.synchronize(
                mpi_ops.grouped_reducescatter_async(
                    list(tensors), name, op, process_set, prescale_factor, postscale_factor
                )
            )
        )

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None,) * 5 + tuple(_reducescatter_grad(grad_outputs, *ctx.args))


def grouped_reducescatter(
    tensors,
    name=None,
    compression=Compression.none,
    op=dtypes.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    op = resolve_op(op, None)
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(
        name, op, process_set, prescale_factor, postscale_factor, *[p[0] for p in pairs]
    )
    return [compression.decompress(t, p[1]) for t, p in zip(outs, pairs)]
