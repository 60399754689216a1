"""Differentiable collectives of the public API: allreduce, grouped_allreduce, allgather,
grouped_allgather, broadcast, alltoall, reducescatter, grouped_reducescatter.

Each runs a conjugate pair of hvdlite/torch/conjugate.py, whose backward is the collective
Horovod defines as its gradient (the rules are in hvdlite.common.gradients); this module adds
Horovod's signatures and wire compression. Every member must run the backward pass too, in the
same order, since the backward collectives are collective.
"""

import torch

from hvdlite.common import dtypes
from hvdlite.common.process_sets import global_process_set
from hvdlite.common.reduction import resolve_op
from hvdlite.torch import conjugate
from hvdlite.torch.compression import Compression


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
    pair = conjugate.Allreduce(average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(conjugate.run1(pair, compressed), ctx)


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
    pair = conjugate.Allreduce(
        average, name, op, prescale_factor, postscale_factor, process_set, grouped=True
    )
    reduced = conjugate.run(pair, *[p[0] for p in pairs])
    return [compression.decompress(t, p[1]) for t, p in zip(reduced, pairs)]


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenation of every member's `tensor` along dim 0 (first dims may
    differ). Differentiable."""
    return conjugate.run1(conjugate.Allgather(name, process_set), tensor)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of a list of tensors as one group; returns the list. Differentiable."""
    return list(conjugate.run(conjugate.Allgather(name, process_set, grouped=True), *tensors))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's `tensor` (root_rank is a global rank), as a new tensor. Differentiable."""
    return conjugate.run1(conjugate.Broadcast(root_rank, name, process_set), tensor)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` to member i (an even split without
    splits). Returns the received tensor, and with splits also the rows
    received from each member (int32 tensor). Differentiable."""
    pair = conjugate.Alltoall(splits, name, process_set)
    output = conjugate.run1(pair, tensor)
    return output if splits is None else (output, torch.tensor(pair.received, dtype=torch.int32))


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
    compressed, ctx = compression.compress(tensor)
    pair = conjugate.Reducescatter(name, resolve_op(op, None), process_set, prescale_factor, postscale_factor)
    return compression.decompress(conjugate.run1(pair, compressed), ctx)


def grouped_reducescatter(
    tensors,
    name=None,
    compression=Compression.none,
    op=dtypes.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """reducescatter of a list of tensors as one group; returns the list. Differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    pair = conjugate.Reducescatter(
        name, resolve_op(op, None), process_set, prescale_factor, postscale_factor, grouped=True
    )
    outs = conjugate.run(pair, *[p[0] for p in pairs])
    return [compression.decompress(t, p[1]) for t, p in zip(outs, pairs)]
