"""hvdlite.torch's asynchronous and in-place collectives (Horovod's names and
arguments). These are not recorded by autograd; the differentiable versions
are in hvdlite.torch.autograd_ops.

Every ``*_async`` function returns an integer handle for ``poll`` /
``synchronize``; the tensors involved stay referenced until then.
"""

import torch

from hvdlite.common import adasum, collectives, dtypes, exceptions, naming, ops
from hvdlite.common import basics as _basics  # noqa: F401  (Horovod's tests reach hvd.mpi_ops._basics)
from hvdlite.common.process_sets import global_process_set, resolve
from hvdlite.common.reduction import resolve_op
from hvdlite.torch.buffers import TORCH


def _copy(tensor, name=None):
    TORCH.check_device(tensor, name or "unnamed")
    return TORCH.contiguous_copy(tensor)


def _first(result):
    return result[0]


def poll(handle):
    """True when the operation behind `handle` has completed."""
    return ops.poll(handle)


def synchronize(handle):
    """Waits for `handle` and returns the operation's output. A callable handle
    (from sparse_allreduce_async) is called and its result returned."""
    if callable(handle):
        return handle()
    return ops.synchronize(handle)


# ---- allreduce ---------------------------------------------------------------


def _output_on_host(kind, op_type, tensor, name, **submit_kw):
    """with_output for any tensor: a CUDA tensor (whose core path has only
    allreduce and broadcast) goes through a host copy, and finish() moves the
    output back to its device."""
    if not TORCH.stage_on_host(tensor):
        return collectives.with_output(TORCH, kind, op_type, tensor, name, **submit_kw)
    pending = collectives.with_output(TORCH, kind, op_type, tensor.detach().cpu(), name, **submit_kw)

    def finish():
        output, splits = pending.finish()
        return output.to(tensor.device), splits

    return pending._replace(finish=finish, keepalive=(tensor, pending.keepalive))


def _adasum_pending(tensor, name, prescale_factor, postscale_factor, process_set):
    """Adasum (hvdlite.common.adasum) in place; CUDA tensors through a host copy."""
    name = naming.auto_name("allreduce", name, TORCH.qualified_names)
    host = tensor.detach().cpu() if TORCH.stage_on_host(tensor) else tensor
    pending = adasum.allreduce_inplace(TORCH, host, name, prescale_factor, postscale_factor, process_set)
    if host is tensor:
        return pending

    def finish():
        TORCH.copy_into(tensor, pending.finish())
        return tensor

    return pending._replace(finish=finish, keepalive=(tensor, pending.keepalive))


def _allreduce_pending(tensor, average, name, op, prescale_factor, postscale_factor, process_set):
    reduce_op = resolve_op(op, average)
    if reduce_op == dtypes.Adasum:
        return _adasum_pending(tensor, name, prescale_factor, postscale_factor, process_set)
    return collectives.inplace(
        TORCH,
        "allreduce",
        ops.ALLREDUCE,
        tensor,
        name,
        reduce_op=reduce_op,
        prescale=prescale_factor,
        postscale=postscale_factor,
        process_set=resolve(process_set),
    )


def allreduce_async_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Starts reducing `tensor` in place (default op: Average); returns a handle."""
    return collectives.start(
        _allreduce_pending(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
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
    """Starts reducing a copy of `tensor`; synchronize() returns the new tensor."""
    return allreduce_async_(
        _copy(tensor, name), average, name, op, prescale_factor, postscale_factor, process_set
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
    """Reduces `tensor` in place across the process set and returns it."""
    reduce_op = resolve_op(op, average)
    if reduce_op == dtypes.Adasum:
        return synchronize(
            allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        )
    return collectives.allreduce_sync(
        TORCH, tensor, name, reduce_op, prescale_factor, postscale_factor, process_set
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
    """Starts reducing every tensor in place; one handle, whose synchronize()
    returns the list of tensors."""
    names = collectives.group_names("allreduce", name, len(tensors))
    return collectives.start_group(
        [
            _allreduce_pending(t, average, n, op, prescale_factor, postscale_factor, process_set)
            for t, n in zip(tensors, names)
        ]
    )


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Starts reducing a copy of each tensor of `tensors`, as one group; returns a handle
    whose synchronize() returns the reduced copies."""
    return grouped_allreduce_async_(
        [_copy(t) for t in tensors], average, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """Reduces each tensor of `tensors` in place, as one group; returns them."""
    return synchronize(
        grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    )


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduces a sparse COO tensor by allgathering its indices and values (as
    Horovod does); returns a callable handle for synchronize()."""
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = allgather_async(
        t.indices().transpose(0, 1).contiguous(), name="%s.indices" % name, process_set=process_set
    )
    values = allgather_async(t.values(), name="%s.values" % name, process_set=process_set)
    members = process_set.size()

    def handle():
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if op == dtypes.Average:
            gathered_values = gathered_values / members
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values, t.size())

    return handle


# ---- allgather, broadcast, alltoall, reducescatter ---------------------------------


def _allgather_pending(tensor, name, process_set):
    if tensor.dim() == 0:  # Horovod: "tried to allgather a rank-zero tensor"
        raise exceptions.InvalidArgumentError("allgather needs a tensor with at least one dimension")
    return _output_on_host("allgather", ops.ALLGATHER, tensor, name, process_set=resolve(process_set))


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every member's `tensor` along dim 0, in rank order."""
    return collectives.start(_allgather_pending(tensor, name, process_set), then=_first)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of each tensor of `tensors`, as one group; returns a handle whose
    synchronize() returns the gathered tensors."""
    names = collectives.group_names("allgather", name, len(tensors))
    return collectives.start_group(
        [_allgather_pending(t, n, process_set) for t, n in zip(tensors, names)], then=_first
    )


def _broadcast_pending(tensor, root_rank, name, process_set):
    return collectives.inplace(
        TORCH, "broadcast", ops.BROADCAST, tensor, name, root=int(root_rank), process_set=resolve(process_set)
    )


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts overwriting `tensor` with root_rank's (a global rank) value, in place."""
    return collectives.start(_broadcast_pending(tensor, root_rank, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of root_rank's `tensor` into a copy; returns a handle whose
    synchronize() returns it."""
    return broadcast_async_(_copy(tensor, name), root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's value, in place; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _split_list(splits):
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        # Horovod: "alltoall expects splits to contain 32-bit integer elements" (a ValueError);
        # int64 is accepted here too, any non-integer dtype is refused.
        if splits.dtype not in (torch.int32, torch.int64):
            raise exceptions.InvalidArgumentError(
                "alltoall splits must be a tensor of 32-bit (or 64-bit) integers, not %s" % splits.dtype
            )
        if splits.dim() > 1:
            raise exceptions.InvalidArgumentError(
                "alltoall expects a 1D splits tensor, got shape %s" % (tuple(splits.shape),)
            )
        return [int(s) for s in splits.reshape(-1).tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[i] rows of `tensor` to member i (an even split of
    dim 0 without splits); synchronize() returns (output, received_splits)."""
    if tensor.dim() == 0:
        raise exceptions.InvalidArgumentError("alltoall needs a tensor with at least one dimension")
    pending = _output_on_host(
        "alltoall", ops.ALLTOALL, tensor, name, splits=_split_list(splits), process_set=resolve(process_set)
    )
    return collectives.start(pending, then=lambda r: (r[0], torch.tensor(r[1], dtype=torch.int32)))


def _reducescatter_pending(tensor, name, op, process_set, prescale_factor, postscale_factor):
    if tensor.dim() == 0:
        raise exceptions.InvalidArgumentError("reducescatter needs a tensor with at least one dimension")
    return _output_on_host(
        "reducescatter",
        ops.REDUCESCATTER,
        tensor,
        name,
        reduce_op=resolve_op(op, None),
        prescale=prescale_factor,
        postscale=postscale_factor,
        process_set=resolve(process_set),
    )


def reducescatter_async(
    tensor,
    name=None,
    op=dtypes.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Starts reducing `tensor` across members; synchronize() returns this
    member's block of rows (the first rows % size members get one extra)."""
    return collectives.start(
        _reducescatter_pending(tensor, name, op, process_set, prescale_factor, postscale_factor), then=_first
    )


def grouped_reducescatter_async(
    tensors,
    name=None,
    op=dtypes.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Starts a reducescatter of each tensor of `tensors`, as one group; returns a handle
    whose synchronize() returns this member's block of each."""
    names = collectives.group_names("reducescatter", name, len(tensors))
    return collectives.start_group(
        [
            _reducescatter_pending(t, n, op, process_set, prescale_factor, postscale_factor)
            for t, n in zip(tensors, names)
        ],
        then=_first,
    )


def join(device=-1):
    """This rank has run out of data: until every rank has joined, it takes part
    in the others' allreduce calls with identity values (other collectives fail
    while a rank is joined, as in Horovod). Returns the rank that joined last. `device` is Horovod's
    argument (a GPU to run on); hvdlite's CPU path ignores it."""
    return ops.join()


def barrier(process_set=global_process_set):
    """Returns once every member of the process set has called barrier()."""
    collectives.barrier(process_set)
