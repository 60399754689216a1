"""The NumPy adapter: Horovod-style collectives on NumPy arrays.

Arrays reach the core by pointer, without a copy when they are C-contiguous;
the adapter keeps them alive until their handle completes. Outputs whose size
only the job knows (allgather, alltoall, reducescatter) are allocated by the
core and wrapped as arrays without a copy.
"""
import numpy as np

from hvdlite.common import dtypes, exceptions, naming, ops
from hvdlite.common.process_sets import global_process_set, resolve

_NUMPY_CODES = {np.dtype(np.uint8): dtypes.UINT8, np.dtype(np.int8): dtypes.INT8,
                np.dtype(np.int32): dtypes.INT32, np.dtype(np.int64): dtypes.INT64,
                np.dtype(np.float16): dtypes.FLOAT16, np.dtype(np.float32): dtypes.FLOAT32,
                np.dtype(np.float64): dtypes.FLOAT64, np.dtype(np.bool_): dtypes.BOOL}


def _dtype_code(array, name):
    code = _NUMPY_CODES.get(array.dtype)
    if code is None and array.dtype.name == "bfloat16":  # ml_dtypes.bfloat16
        code = dtypes.BFLOAT16
    if code is None:
        raise exceptions.NotSupportedError(
            "tensor '%s' has dtype %s, which hvdlite does not support; use one of %s"
            % (name, array.dtype, ", ".join(sorted(dtypes.CODE_BY_NAME))))
    return code


def _resolve_op(op, average):
    if average is not None:
        if op is not None:
            raise exceptions.InvalidArgumentError("pass either op= or the deprecated average=, not both")
        return dtypes.Average if average else dtypes.Sum
    return dtypes.Average if op is None else op


def _submit(kind, op_type, array, name, **kw):
    name = naming.auto_name(kind, name)
    code = _dtype_code(array, name)
    # The array itself: the core reads its address through the buffer protocol
    # (array.ctypes.data costs about a microsecond per call).
    return ops.submit(op_type, name, array, code, array.shape, **kw)


def _from_core_output(core_handle, dtype):
    data, shape, splits, _ = ops.take_output(core_handle)
    return data.view(dtype).reshape(shape), splits


def _inplace_async(kind, op_type, tensor, name, **kw):
    """Runs an in-place op on `tensor`; a non-contiguous array goes through a
    contiguous copy that is written back on completion."""
    work = tensor if tensor.flags.c_contiguous and tensor.flags.writeable else np.ascontiguousarray(tensor)
    core = _submit(kind, op_type, work, name, **kw)

    def finish():
        ops.release(core)
        if work is not tensor:
            tensor[...] = work
        return tensor

    return ops.register(core, finish, keepalive=(tensor, work))


# ---- allreduce -------------------------------------------------------------

def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    return _inplace_async("allreduce", ops.ALLREDUCE, tensor, name, reduce_op=_resolve_op(op, average),
                          prescale=prescale_factor, postscale=postscale_factor, process_set=resolve(process_set))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    return allreduce_async_(np.array(tensor, copy=True, order="C"), average, name, op, prescale_factor,
                            postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """Reduces `tensor` across the process set in place and returns it."""
    return ops.synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                            process_set))


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    """Returns a new array: `tensor` reduced (default: averaged) across the process set."""
    return ops.synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                           process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    base = naming.auto_name("grouped_allreduce", name)
    return [allreduce_async_(t, average, "%s.%d" % (base, i), op, prescale_factor, postscale_factor, process_set)
            for i, t in enumerate(tensors)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    copies = [np.array(t, copy=True, order="C") for t in tensors]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    handles = grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    return [ops.synchronize(h) for h in handles]


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    handles = grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    return [ops.synchronize(h) for h in handles]


# ---- allgather, broadcast, alltoall, reducescatter --------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    work = np.ascontiguousarray(tensor)
    core = _submit("allgather", ops.ALLGATHER, work, name, process_set=resolve(process_set))
    return ops.register(core, lambda: _from_core_output(core, work.dtype)[0], keepalive=work)


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every member's `tensor` along the first dimension, in rank
    order; first dimensions may differ across ranks."""
    return ops.synchronize(allgather_async(tensor, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return _inplace_async("broadcast", ops.BROADCAST, tensor, name, root=root_rank,
                          process_set=resolve(process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async_(np.array(tensor, copy=True, order="C"), root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's value, in place; returns it."""
    return ops.synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every member."""
    return ops.synchronize(broadcast_async(tensor, root_rank, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    work = np.ascontiguousarray(tensor)
    if work.ndim == 0:
        raise exceptions.InvalidArgumentError("alltoall needs a tensor with at least one dimension")
    split_list = [] if splits is None else [int(s) for s in np.asarray(splits).reshape(-1)]
    core = _submit("alltoall", ops.ALLTOALL, work, name, splits=split_list, process_set=resolve(process_set))

    def finish():
        out, received = _from_core_output(core, work.dtype)
        return (out, np.asarray(received, dtype=np.int32)) if splits is not None else out

    return ops.register(core, finish, keepalive=work)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows (first dimension) of `tensor` to member i and
    concatenates what every member sent here. Without splits the first
    dimension is divided evenly. Returns the output, and with splits also the
    rows received from each member (as Horovod does)."""
    return ops.synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(tensor, op=None, name=None, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    work = np.ascontiguousarray(tensor)
    if work.ndim == 0:
        raise exceptions.InvalidArgumentError("reducescatter needs a tensor with at least one dimension")
    core = _submit("reducescatter", ops.REDUCESCATTER, work, name, reduce_op=_resolve_op(op, None),
                   prescale=prescale_factor, postscale=postscale_factor, process_set=resolve(process_set))
    return ops.register(core, lambda: _from_core_output(core, work.dtype)[0], keepalive=work)


def reducescatter(tensor, op=None, name=None, process_set=global_process_set, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces `tensor` (default: averages) across members and returns this
    member's block of rows: the first dimension is split with the first
    (rows % size) members taking one extra row."""
    return ops.synchronize(reducescatter_async(tensor, op, name, process_set, prescale_factor, postscale_factor))


def barrier(process_set=global_process_set):
    """Returns once every member of the process set has called barrier()."""
    core = ops.submit(ops.BARRIER, naming.auto_name("barrier", None), 0, dtypes.UINT8, (0,),
                      process_set=resolve(process_set))
    ops.wait(core)
    ops.release(core)
