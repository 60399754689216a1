"""The collectives of expert parallelism, as autograd Functions over hvdlite.torch's public
(non-differentiable) collectives, named explicitly by the caller (the generic differentiable
collectives name their backward collectives per process, which can differ between members):

  all_to_all     alltoall(splits)           | alltoall of the gradient with the received splits
  sum_everywhere allreduce(Sum)             | allreduce(Sum) of the gradient

Every member of the set must call the same functions with the same names in the same order,
forward and backward (they are collectives); each call blocks until its collective completes.
``sum_everywhere``'s backward is the gradient of a loss every member computes from the same
reduced value (each adds it to its own loss): member r's input receives the sum of every
member's upstream gradient, so averaging gradients over the set gives the gradient of that
loss computed once.
"""

import torch

from hvdlite.common import dtypes
from hvdlite.torch import mpi_ops


def exchange(t, splits, name, ps):
    """alltoall of `t` (rows split by `splits`, one entry per member); returns (rows received,
    rows received from each member as a list). Not differentiable."""
    out, received = mpi_ops.synchronize(
        mpi_ops.alltoall_async(
            t.contiguous(), splits=torch.tensor(splits, dtype=torch.int32), name=name, process_set=ps
        )
    )
    return out, [int(n) for n in received.tolist()]


def gather_rows(t, name, ps):
    """allgather along dim 0 (not differentiable)."""
    return mpi_ops.synchronize(mpi_ops.allgather_async(t.contiguous(), name=name, process_set=ps))


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, splits, name, ps):
        out, received = exchange(x, splits, name, ps)
        ctx.received, ctx.name, ctx.ps = received, name, ps
        return out

    @staticmethod
    def backward(ctx, grad):
        back, _ = exchange(grad, ctx.received, ctx.name + ".bwd", ctx.ps)
        return back, None, None, None


class _SumEverywhere(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name, ps):
        ctx.name, ctx.ps = name, ps
        return _sum(x, name, ps)

    @staticmethod
    def backward(ctx, grad):
        return _sum(grad, ctx.name + ".bwd", ctx.ps), None, None


def _sum(t, name, ps):
    return mpi_ops.synchronize(
        mpi_ops.allreduce_async(t.contiguous(), name=name, op=dtypes.Sum, process_set=ps)
    )


def all_to_all(x, splits, name, process_set):
    """Sends splits[i] rows of `x` to member i; returns the rows received, in member order.
    Backward sends each gradient row back to where its row came from. Zero rows anywhere
    are fine."""
    return _AllToAll.apply(x, list(splits), name, process_set)


def sum_everywhere(x, name, process_set):
    """Sum over the set; the gradient is summed over the set too (see the module docstring)."""
    return _SumEverywhere.apply(x, name, process_set)
