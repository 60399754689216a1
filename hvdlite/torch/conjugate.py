"""Differentiable collectives, defined once: each is a conjugate pair, a forward collective and
the collective that is its gradient, written as a class with an explicit ``forward`` and
``backward`` (in the manner of Megatron-Core's ``tensor_parallel/mappings.py``). One autograd
Function (``_Conjugate``) runs any pair; the public differentiable collectives
(``hvdlite/torch/autograd_ops.py``), tensor parallelism, MoE and context parallelism all call
the pairs below, and nothing else defines a collective's gradient.

Horovod's collectives (the public API; the rules are ``hvdlite/common/gradients.py``):

  Allreduce(op)        allreduce(op, scales)          | allreduce(same op, same scales)
  Allgather            allgather (dim 0)              | allreduce(Average), this member's rows
  Broadcast(root)      broadcast(root)                | allreduce(Average) on the root, else 0
  Alltoall(splits)     alltoall(splits)               | alltoall(the splits received)
  Reducescatter(op)    reducescatter(op)              | allgather, scaled

Model-parallel regions (tensor, sequence and context parallelism; Sum, not Average, because
every member holds a part of one computation rather than a replica of it):

  CopyToRegion         identity                       | allreduce(Sum)
  ReduceFromRegion     allreduce(Sum)                 | identity
  GatherFromRegion     allgather(dim)                 | this member's block
  ScatterToRegion      this member's block            | allgather(dim)
  GatherSequence       allgather(dim)                 | reducescatter(Sum, dim)
  ReduceScatterSequence reducescatter(Sum, dim)       | allgather(dim)

Contract. Every member of the process set must run the same pairs in the same order, forward
and backward (both directions are collectives), and each call blocks until its collective has
completed. A pair object is made per call and keeps what its backward needs. When the forward
collective has a name, its backward collective is named ``name + ".bwd"``; without one both are
named automatically. Sizes that do not divide evenly are split as reducescatter splits rows:
the first (n % size) members take one extra (``partition``).
"""

import torch

from hvdlite.common import dtypes, gradients
from hvdlite.common.basics import rank as _global_rank
from hvdlite.torch import mpi_ops

# -- blocking, non-differentiable collectives the pairs (and their callers) are built from --


def partition(n, parts, index):
    """(start, length) of member `index`'s block when n items are split over `parts` members,
    the first n % parts members taking one extra (reducescatter's split)."""
    base, extra = divmod(n, parts)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def _suffixed(name, suffix):
    return None if name is None else name + suffix


def _bwd(name):
    return _suffixed(name, ".bwd")


def allreduce_now(t, op, name, ps):
    """Elementwise reduction (dtypes.Sum, Max, ...) over the set; blocks; not differentiable."""
    return mpi_ops.synchronize(
        mpi_ops.allreduce_async(t.detach().contiguous(), name=name, op=op, process_set=ps)
    )


def gather_now(t, dim, name, ps):
    """Concatenation of every member's `t` along `dim` (sizes along `dim` may differ)."""
    moved = t.detach().movedim(dim, 0).contiguous()
    return mpi_ops.synchronize(mpi_ops.allgather_async(moved, name=name, process_set=ps)).movedim(0, dim)


def reduce_scatter_now(t, dim, name, ps):
    """This member's block (``partition``) along `dim` of the sum of every member's `t`."""
    moved = t.detach().movedim(dim, 0).contiguous()
    out = mpi_ops.synchronize(mpi_ops.reducescatter_async(moved, name=name, op=dtypes.Sum, process_set=ps))
    return out.movedim(0, dim)


def exchange(t, splits, name, ps):
    """alltoall of `t`'s rows (splits[i] rows to member i: a list or an int tensor; None: an
    even split); returns (rows received, rows received from each member as a list)."""
    out, received = mpi_ops.synchronize(mpi_ops.alltoall_async(t.detach().contiguous(), splits, name, ps))
    return out, [int(n) for n in received.tolist()]


def sizes_now(t, dim, name, ps):
    """Every member's size of `t` along `dim`, in member order."""
    n = torch.tensor([t.shape[dim]], dtype=torch.int64)
    return mpi_ops.synchronize(mpi_ops.allgather_async(n, name=name, process_set=ps)).tolist()


def block_of(t, dim, ps):
    """This member's block of `t` along `dim` (``partition``), contiguous."""
    start, length = partition(t.shape[dim], ps.size(), ps.rank())
    return t.narrow(dim, start, length).contiguous()


def _block_of_gathered(t, dim, sizes, ps):
    me = ps.rank()
    return t.narrow(dim, sum(sizes[:me]), sizes[me]).contiguous()


# -- the one autograd Function --


class _Conjugate(torch.autograd.Function):
    """Runs pair.forward on the tensors and, in backward, pair.backward on their gradients."""

    @staticmethod
    def forward(ctx, pair, *tensors):
        ctx.pair = pair
        return tuple(pair.forward(*tensors))

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.pair.backward(*grads))


def run(pair, *tensors):
    """The outputs (a tuple) of `pair`'s forward collective on `tensors`, differentiable."""
    return _Conjugate.apply(pair, *tensors)


def run1(pair, tensor):
    """``run`` for a pair of one tensor in and one out."""
    return _Conjugate.apply(pair, tensor)[0]


# -- Horovod's collectives --


class Allreduce:
    """allreduce | allreduce with the same op and scales (grouped: one group for all tensors)."""

    def __init__(self, average, name, op, prescale, postscale, ps, grouped=False):
        self.args = (average, op, prescale, postscale, ps)
        self.name, self.grouped = name, grouped

    def _reduce(self, tensors, name):
        average, op, prescale, postscale, ps = self.args
        if self.grouped:
            handle = mpi_ops.grouped_allreduce_async(
                list(tensors), average, name, op, prescale, postscale, ps
            )
            return tuple(mpi_ops.synchronize(handle))
        (t,) = tensors
        return (mpi_ops.synchronize(mpi_ops.allreduce_async(t, average, name, op, prescale, postscale, ps)),)

    def forward(self, *tensors):
        return self._reduce(tensors, self.name)

    def backward(self, *grads):
        return self._reduce(grads, _bwd(self.name))


class Allgather:
    """allgather along dim 0 | Horovod's gradient: the average of every member's upstream
    gradient, restricted to this member's rows."""

    def __init__(self, name, ps, grouped=False):
        self.name, self.ps, self.grouped = name, ps, grouped

    def forward(self, *tensors):
        self.rows = [t.shape[0] if t.dim() else 1 for t in tensors]
        if self.grouped:
            handle = mpi_ops.grouped_allgather_async(list(tensors), self.name, self.ps)
            return tuple(mpi_ops.synchronize(handle))
        return (mpi_ops.synchronize(mpi_ops.allgather_async(tensors[0], self.name, self.ps)),)

    def backward(self, *grads):
        bwd = _bwd(self.name)
        reduced = mpi_ops.synchronize(
            mpi_ops.grouped_allreduce_async(
                list(grads), name=bwd, op=gradients.ALLGATHER_GRAD_OP, process_set=self.ps
            )
        )
        mine = torch.tensor([self.rows], dtype=torch.int64)
        table = mpi_ops.synchronize(mpi_ops.allgather_async(mine, _suffixed(bwd, ".rows"), self.ps))
        out = []
        for i, grad in enumerate(reduced):
            offset, count = gradients.allgather_grad_slice(table[:, i].tolist(), self.ps.rank())
            out.append(grad.narrow(0, offset, count))
        return tuple(out)


class Broadcast:
    """broadcast from root_rank (a global rank) | allreduce(Average) kept on the root, zeros
    on every other member."""

    def __init__(self, root_rank, name, ps):
        self.root_rank, self.name, self.ps = root_rank, name, ps

    def forward(self, tensor):
        return (mpi_ops.synchronize(mpi_ops.broadcast_async(tensor, self.root_rank, self.name, self.ps)),)

    def backward(self, grad):
        handle = mpi_ops.allreduce_async(
            grad, name=_bwd(self.name), op=gradients.BROADCAST_GRAD_OP, process_set=self.ps
        )
        reduced = mpi_ops.synchronize(handle)
        return (reduced if _global_rank() == self.root_rank else torch.zeros_like(reduced),)


class Alltoall:
    """alltoall with `splits` (rows to each member; None: even) | alltoall of the gradient with
    the splits received, which sends each gradient row back to where its row came from. After
    forward, ``received`` holds the rows received from each member (a list)."""

    def __init__(self, splits, name, ps):
        self.splits, self.name, self.ps = splits, name, ps

    def forward(self, tensor):
        out, self.received = exchange(tensor, self.splits, self.name, self.ps)
        return (out,)

    def backward(self, grad):
        return (exchange(grad, self.received, _bwd(self.name), self.ps)[0],)


class Reducescatter:
    """reducescatter(op, scales) | allgather of the gradient, scaled as Horovod does
    (``gradients.reducescatter_grad_scale``)."""

    def __init__(self, name, op, ps, prescale, postscale, grouped=False):
        self.name, self.op, self.ps, self.grouped = name, op, ps, grouped
        self.scales = (prescale, postscale)

    def forward(self, *tensors):
        if self.grouped:
            handle = mpi_ops.grouped_reducescatter_async(
                list(tensors), self.name, self.op, self.ps, *self.scales
            )
            return tuple(mpi_ops.synchronize(handle))
        handle = mpi_ops.reducescatter_async(tensors[0], self.name, self.op, self.ps, *self.scales)
        return (mpi_ops.synchronize(handle),)

    def backward(self, *grads):
        scale = gradients.reducescatter_grad_scale(self.op, *self.scales, self.ps.size())
        scaled = [g * scale if scale != 1.0 else g for g in grads]
        handle = mpi_ops.grouped_allgather_async(scaled, _bwd(self.name), self.ps)
        return tuple(mpi_ops.synchronize(handle))


# -- model-parallel regions --


class _Named:
    def __init__(self, name, ps, dim=0):
        self.name, self.ps, self.dim = name, ps, dim


class CopyToRegion(_Named):
    """identity | allreduce(Sum): entering a region where each member computes a part."""

    def forward(self, x):
        return (x.view_as(x),)

    def backward(self, grad):
        return (allreduce_now(grad, dtypes.Sum, _bwd(self.name), self.ps),)


class ReduceFromRegion(_Named):
    """allreduce(Sum) | identity: leaving a region whose members hold partial sums."""

    def forward(self, x):
        return (allreduce_now(x, dtypes.Sum, self.name, self.ps),)

    def backward(self, grad):
        return (grad,)


class GatherFromRegion(_Named):
    """allgather along dim | this member's block of the gradient (the upstream gradient must be
    the same on every member). `sizes` (every member's size along dim), when the caller knows
    them, saves a collective."""

    def __init__(self, name, ps, dim, sizes=None):
        super().__init__(name, ps, dim)
        self.sizes = sizes

    def forward(self, x):
        if self.sizes is None:
            self.sizes = sizes_now(x, self.dim, _suffixed(self.name, ".sizes"), self.ps)
        return (gather_now(x, self.dim, self.name, self.ps),)

    def backward(self, grad):
        return (_block_of_gathered(grad, self.dim, self.sizes, self.ps),)


class ScatterToRegion(_Named):
    """this member's block along dim | allgather of the gradient along dim."""

    def forward(self, x):
        return (block_of(x, self.dim, self.ps),)

    def backward(self, grad):
        return (gather_now(grad, self.dim, _bwd(self.name), self.ps),)


class GatherSequence(_Named):
    """allgather along dim | reducescatter(Sum) of the gradient along dim: every member's
    gathered copy feeds its own computation, so each block's gradient is the sum over members."""

    def forward(self, x):
        return (gather_now(x, self.dim, self.name, self.ps),)

    def backward(self, grad):
        return (reduce_scatter_now(grad, self.dim, _bwd(self.name), self.ps),)


class ReduceScatterSequence(_Named):
    """reducescatter(Sum) along dim | allgather of the gradient along dim."""

    def forward(self, x):
        return (reduce_scatter_now(x, self.dim, self.name, self.ps),)

    def backward(self, grad):
        return (gather_now(grad, self.dim, _bwd(self.name), self.ps),)


# -- the pairs as functions (what tensor, sequence, expert and context parallelism call) --


def copy_to_region(x, name, process_set):
    """Identity forward; the gradient is summed over the set (entering a parallel region)."""
    return run1(CopyToRegion(name, process_set), x)


def reduce_from_region(x, name, process_set):
    """Sum over the set forward; identity backward (leaving a row-parallel region)."""
    return run1(ReduceFromRegion(name, process_set), x)


def gather_from_region(x, dim, name, process_set, sizes=None):
    """Every member's block concatenated along `dim`; the gradient is this member's block."""
    return run1(GatherFromRegion(name, process_set, dim, sizes), x)


def scatter_to_region(x, dim, name, process_set):
    """This member's block of `x` along `dim` (``partition``); the gradient is gathered."""
    return run1(ScatterToRegion(name, process_set, dim), x)


def gather_sequence(x, name, process_set, dim=0):
    """Sequence-parallel to full: allgather along `dim`; gradient reduce-scattered (Sum)."""
    return run1(GatherSequence(name, process_set, dim), x)


def reduce_scatter_sequence(x, name, process_set, dim=0):
    """Partial sums to sequence-parallel: reducescatter(Sum) along `dim`; gradient gathered."""
    return run1(ReduceScatterSequence(name, process_set, dim), x)


def scatter_sequence(x, name, process_set, dim=0):
    """Full to sequence-parallel (this member's block along `dim`); gradient gathered."""
    return run1(ScatterToRegion(name, process_set, dim), x)


def sum_everywhere(x, name, process_set):
    """allreduce(Sum), whose gradient is allreduce(Sum) too: every member adds the same reduced
    value to its own loss, so member r's input receives the sum of every member's upstream
    gradient, and averaging gradients over the set gives the gradient of that loss computed once."""
    return run1(Allreduce(None, name, dtypes.Sum, 1.0, 1.0, process_set), x)


def all_to_all(x, splits, name, process_set):
    """Sends splits[i] rows of `x` to member i (None: an even split); returns the rows received,
    in member order. Backward sends each gradient row back to where its row came from."""
    return run1(Alltoall(splits, name, process_set), x)
