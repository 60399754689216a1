"""Non-differentiable collectives on lists of TensorFlow tensors.

Each function takes a list of tensors and already-resolved names and a registered ProcessSet (every rank
must use the same names; see hvdlite.common.naming), submits ALL of them to
the core before waiting for any (so the core can fuse them; in a graph allreduce and
broadcast submit each tensor as soon as it exists, see await_op.allreduce and
buffers.call_each), and returns a list of tf.Tensors. They run eagerly or in a graph
(tf.function, tf.compat.v1) as a submission, an await that holds no executor thread, and a
result (hvdlite.tensorflow.buffers.call_collective). The submission itself is hvdlite's
framework-neutral NumPy path (hvdlite.common.collectives with the NUMPY buffer adapter), no
policy of its own; in a graph, allreduce (but Adasum) is submitted by a kernel instead
(await_op.allreduce), with the arguments resolved here, when the graph is built.
"""

import numpy as np
import tensorflow as tf

from hvdlite.common import adasum, collectives, dtypes, ops
from hvdlite.common.numpy_buffers import NUMPY
from hvdlite.common.process_sets import resolve
from hvdlite.tensorflow import await_op
from hvdlite.tensorflow.buffers import call_collective, call_each, check_dtype, writable


def _rows_shape(tensor):
    """Static shape of an output whose first dimension only the job knows."""
    return tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else tf.TensorShape(None)


def _check(tensors, what):
    for t in tensors:
        check_dtype(t, what)


def _writable(array):
    return array if array.flags.writeable and array.flags.c_contiguous else np.array(array, order="C")


def allreduce(tensors, names, op, prescale, postscale, process_set):
    """Reduced copies of `tensors` (same shapes and dtypes). In a graph each tensor's
    allreduce starts as soon as that tensor exists, in list order: through the native
    submission (await_op.allreduce: no Python call per step) when the library has it and
    the op is not Adasum (whose steps run in Python), else buffers.call_each."""
    _check(tensors, "allreduce")
    native = _native_allreduce(tensors, names, op, prescale, postscale, process_set)
    if native is not None:
        return native

    def start_one(array, name, owned):
        return collectives.start(
            adasum.allreduce_inplace_any(
                NUMPY, writable(array, owned), name, op, prescale, postscale, process_set
            )
        )

    return call_each(start_one, _synchronize_all, tensors, names, "HvdliteAllreduce")


def _native_allreduce(tensors, names, op, prescale, postscale, process_set):
    """await_op.allreduce of each tensor in a graph, or None where it does not apply."""
    if tf.executing_eagerly() or op == dtypes.Adasum or await_op.load() is None:
        return None
    if process_set is not None and process_set.process_set_id is None:
        return None  # not registered yet: the NumPy path resolves it when the graph runs
    set_id = resolve(process_set)
    outs = []
    for t, n in zip(tensors, names):
        out = await_op.allreduce(t, n, op, prescale, postscale, set_id)
        if out is None:  # a library that predates the native submission
            return None
        outs.append(out)
    return outs


def _synchronize_all(handles):
    return [ops.synchronize(h) for h in handles]


def _with_output(kind, op_type, tensors, names, process_set, **submit_kw):
    """Runs an op whose output the core allocates; returns the outputs."""

    def start(*arrays):
        set_id = resolve(process_set)
        return [
            collectives.start(
                collectives.with_output(
                    NUMPY, kind, op_type, _writable(a), n, process_set=set_id, **submit_kw
                )
            )
            for a, n in zip(arrays, names)
        ]

    return call_collective(
        start,
        lambda handles: [ops.synchronize(h)[0] for h in handles],
        tensors,
        [t.dtype for t in tensors],
        [_rows_shape(t) for t in tensors],
        "Hvdlite" + kind.capitalize(),
    )


def allgather(tensors, names, process_set):
    """Every member's tensors concatenated along the first dimension."""
    _check(tensors, "allgather")
    return _with_output("allgather", ops.ALLGATHER, tensors, names, process_set)


def reducescatter(tensors, names, op, prescale, postscale, process_set):
    """This member's block of rows of each reduced tensor."""
    _check(tensors, "reducescatter")
    return _with_output(
        "reducescatter",
        ops.REDUCESCATTER,
        tensors,
        names,
        process_set,
        reduce_op=op,
        prescale=prescale,
        postscale=postscale,
    )


def alltoall(tensor, splits, name, process_set):
    """(output, rows received from each member as int32). `splits` is a list
    of ints, or a tensor (then it is an input of the numpy function)."""
    check_dtype(tensor, "alltoall")
    inputs = [tensor] if splits is None else [tensor, tf.cast(tf.reshape(splits, [-1]), tf.int64)]

    def start(array, split_values=None):
        split_list = [] if split_values is None else [int(s) for s in split_values]
        handle = collectives.start(
            collectives.with_output(
                NUMPY,
                "alltoall",
                ops.ALLTOALL,
                _writable(array),
                name,
                splits=split_list,
                process_set=resolve(process_set),
            )
        )
        return [handle]

    def finish(handles):
        out, received = ops.synchronize(handles[0])
        return [out, np.asarray(received, dtype=np.int32)]

    out, received = call_collective(
        start,
        finish,
        inputs,
        [tensor.dtype, tf.int32],
        [_rows_shape(tensor), tf.TensorShape([None])],
        "HvdliteAlltoall",
    )
    return out, received


def broadcast(tensors, names, root_rank, process_set):
    """root_rank's values of `tensors` on every member."""
    _check(tensors, "broadcast")

    def start_one(array, name, owned):
        return collectives.start(
            collectives.inplace(
                NUMPY,
                "broadcast",
                ops.BROADCAST,
                writable(array, owned),
                name,
                root=root_rank,
                process_set=resolve(process_set),
            )
        )

    return call_each(start_one, _synchronize_all, tensors, names, "HvdliteBroadcast")
