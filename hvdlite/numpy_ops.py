"""The NumPy adapter: Horovod-style collectives on NumPy arrays.

Arrays reach the core by pointer, without a copy when they are C-contiguous;
the adapter keeps them alive until their handle completes. Outputs whose size
only the job knows (allgather, alltoall, reducescatter) are allocated by the
core and wrapped as arrays without a copy.
"""

import functools

import numpy as np

from hvdlite.common import adasum, collectives, dtypes, exceptions, ops, p2p
from hvdlite.common.numpy_buffers import NUMPY
from hvdlite.common.process_sets import global_process_set, resolve
from hvdlite.common.reduction import resolve_op


def _inplace_async(kind, op_type, tensor, name, **kw):
    """Runs an in-place op on `tensor`; a non-contiguous array goes through a
    contiguous copy that is written back on completion."""
    return collectives.start(collectives.inplace(NUMPY, kind, op_type, tensor, name, **kw))


def _output_async(kind, op_type, tensor, name, **kw):
    """An op whose output the core allocates; synchronize() returns (array, received splits)."""
    return collectives.with_output(NUMPY, kind, op_type, np.ascontiguousarray(tensor), name, **kw)


# ---- allreduce -------------------------------------------------------------


def allreduce_async_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Starts reducing `tensor` (a C-contiguous NumPy array) across the process set in place;
    returns a handle for synchronize() / poll(), which returns `tensor`."""
    reduce_op = resolve_op(op, average)
    return collectives.start(
        adasum.allreduce_inplace_any(
            NUMPY, tensor, name, reduce_op, prescale_factor, postscale_factor, process_set
        )
    )


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Starts reducing a copy of `tensor` across the process set; returns a handle whose
    synchronize() returns the reduced copy (default: averaged)."""
    return allreduce_async_(
        np.array(tensor, copy=True, order="C"),
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )


def allreduce_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Reduces `tensor` across the process set in place and returns it."""
    reduce_op = resolve_op(op, average)
    if reduce_op == dtypes.Adasum:
        return ops.synchronize(
            allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        )
    return collectives.allreduce_sync(
        NUMPY, tensor, name, reduce_op, prescale_factor, postscale_factor, process_set
    )


def allreduce(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Returns a new array: `tensor` reduced (default: averaged) across the process set."""
    return allreduce_(
        np.array(tensor, copy=True, order="C"),
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )


def grouped_allreduce_async_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Starts reducing each array of `tensors` in place, as one group; returns one handle per
    array."""
    names = collectives.group_names("allreduce", name, len(tensors))
    return [
        allreduce_async_(t, average, n, op, prescale_factor, postscale_factor, process_set)
        for n, t in zip(names, tensors)
    ]


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Starts reducing a copy of each array of `tensors`, as one group; returns one handle
    per array."""
    copies = [np.array(t, copy=True, order="C") for t in tensors]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Reduces each array of `tensors` in place, as one group; returns them."""
    handles = grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return [ops.synchronize(h) for h in handles]


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Returns new arrays: each of `tensors` reduced (default: averaged) across the process set."""
    handles = grouped_allreduce_async(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return [ops.synchronize(h) for h in handles]


# ---- allgather, broadcast, alltoall, reducescatter --------------------------


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather of `tensor` (see allgather); returns a handle for synchronize()."""
    pending = _output_async("allgather", ops.ALLGATHER, tensor, name, process_set=resolve(process_set))
    return collectives.start(pending, then=lambda result: result[0])


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every member's `tensor` along the first dimension, in rank
    order; first dimensions may differ across ranks."""
    return ops.synchronize(allgather_async(tensor, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts overwriting `tensor` with root_rank's value, in place; returns a handle whose
    synchronize() returns `tensor`."""
    return _inplace_async(
        "broadcast", ops.BROADCAST, tensor, name, root=root_rank, process_set=resolve(process_set)
    )


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of root_rank's `tensor` into a copy; returns a handle whose
    synchronize() returns it."""
    return broadcast_async_(np.array(tensor, copy=True, order="C"), root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's value, in place; returns it."""
    return collectives.inplace_sync(
        NUMPY, "broadcast", ops.BROADCAST, tensor, name, root=root_rank, process_set=resolve(process_set)
    )


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every member."""
    return ops.synchronize(broadcast_async(tensor, root_rank, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall of `tensor` (see alltoall); returns a handle for synchronize()."""
    if np.ndim(tensor) == 0:
        raise exceptions.InvalidArgumentError("alltoall needs a tensor with at least one dimension")
    split_list = [] if splits is None else [int(s) for s in np.asarray(splits).reshape(-1)]
    pending = _output_async(
        "alltoall", ops.ALLTOALL, tensor, name, splits=split_list, process_set=resolve(process_set)
    )

    def then(result):
        out, received = result
        return (out, np.asarray(received, dtype=np.int32)) if splits is not None else out

    return collectives.start(pending, then)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows (first dimension) of `tensor` to member i and
    concatenates what every member sent here. Without splits the first
    dimension is divided evenly. Returns the output, and with splits also the
    rows received from each member (as Horovod does)."""
    return ops.synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(
    tensor, op=None, name=None, process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0
):
    """Starts a reducescatter of `tensor` (see reducescatter); returns a handle whose
    synchronize() returns this member's block of rows."""
    if np.ndim(tensor) == 0:
        raise exceptions.InvalidArgumentError("reducescatter needs a tensor with at least one dimension")
    pending = _output_async(
        "reducescatter",
        ops.REDUCESCATTER,
        tensor,
        name,
        reduce_op=resolve_op(op, None),
        prescale=prescale_factor,
        postscale=postscale_factor,
        process_set=resolve(process_set),
    )
    return collectives.start(pending, then=lambda result: result[0])


def reducescatter(
    tensor, op=None, name=None, process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0
):
    """Reduces `tensor` (default: averages) across members and returns this
    member's block of rows: the first dimension is split with the first
    (rows % size) members taking one extra row."""
    return ops.synchronize(
        reducescatter_async(tensor, op, name, process_set, prescale_factor, postscale_factor)
    )


def barrier(process_set=global_process_set):
    """Returns once every member of the process set has called barrier()."""
    collectives.barrier(process_set)


# ---- point-to-point (hvdlite/common/p2p.py) ---------------------------------


def send_async(tensor, dst, tag=0, process_set=global_process_set, name=None):
    """Posts a send of `tensor` to rank `dst` of `process_set`, matched by `tag`; returns a
    handle whose synchronize() returns None once `tensor` may be reused (never waits for
    the receiver to post its recv)."""
    return p2p.start(NUMPY, p2p.SEND, tensor, dst, tag, process_set, name)


def recv_async(tensor, src, tag=0, process_set=global_process_set, name=None):
    """Posts a receive into `tensor` (whose shape and dtype the message must have) from rank
    `src` of `process_set` with `tag`; synchronize() returns `tensor`."""
    return p2p.start(NUMPY, p2p.RECV, tensor, src, tag, process_set, name)


def send(tensor, dst, tag=0, process_set=global_process_set, name=None):
    """Sends `tensor` to rank `dst` of `process_set`; returns once `tensor` may be reused."""
    p2p.run(NUMPY, p2p.SEND, tensor, dst, tag, process_set, name)


def recv(tensor, src, tag=0, process_set=global_process_set, name=None):
    """Receives the message from rank `src` of `process_set` with `tag` into `tensor`; returns it."""
    return p2p.run(NUMPY, p2p.RECV, tensor, src, tag, process_set, name)


def batch_isend_irecv(p2p_ops):
    """Posts every P2POp at once (as torch.distributed.batch_isend_irecv); returns their handles."""
    return p2p.start_group(p2p_ops, functools.partial(p2p.post, NUMPY))
