"""hvdlite.tensorflow's collectives: Horovod's names, arguments and
semantics, differentiable (tf.custom_gradient) after the rules in
hvdlite.common.gradients, eager or inside tf.function.

Names are resolved when the Python call runs (eagerly: every call; in a
tf.function: once, at trace time), numbered per kind in call order when not
given, so ranks making the same calls agree.
"""

import itertools
from typing import Any

import tensorflow as tf

from hvdlite.common import basics as _basics  # noqa: F401  (Horovod's tests reach hvd.mpi_ops._basics)
from hvdlite.common import collectives, dtypes, exceptions, gradients, naming, ops, topology
from hvdlite.common.native import core as _core
from hvdlite.common.process_sets import global_process_set
from hvdlite.common.reduction import resolve_op
from hvdlite.tensorflow import raw_ops
from hvdlite.tensorflow.compression import Compression


def collectives_group_names(kind, name, count):
    """'<name>.<i>' for each member of a grouped call (hvdlite.common.collectives)."""
    return collectives.group_names(kind, name, count)


def _differentiable(forward, backward, tensors):
    """forward(list of tensors) -> list of tensors, with gradient
    backward(list of upstream gradients) -> list (one per input)."""

    @tf.custom_gradient
    def fn(*xs):
        outs = forward(list(xs))

        def grad(*dys):
            # An output nothing depends on (alltoall's received splits) has no upstream
            # gradient in a graph (tf.gradients): zeros, so every rank runs the same backward.
            return backward(
                [tf.zeros_like(o) if d is None else tf.convert_to_tensor(d) for d, o in zip(dys, outs)]
            )

        return outs, grad

    out = fn(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _grad_namer(names):
    """names() -> the gradient names of one backward pass: '<name>.grad', then
    '<name>.grad.<k>' for the k-th further pass of the same forward call (a graph may hold
    several backward passes of one collective, e.g. one tf.gradients call per output of a
    grouped op; each needs its own names). Backward passes are built in the same order on
    every rank, so the names agree."""
    calls = itertools.count()

    def next_names():
        k = next(calls)
        return [n + ".grad" + ("" if k == 0 else ".%d" % k) for n in names]

    return next_names


def _check_set_exists(process_set):
    """InvalidArgumentError (a ValueError, as Horovod raises when its op is built) when the job
    runs and `process_set` carries an id the core does not know (removed, or set by hand),
    before any op is built; the core would only fail the op when it runs."""
    set_id = getattr(process_set, "process_set_id", None)
    if set_id is not None and _core.is_initialized() and _core.process_set_ranks(int(set_id)) is None:
        raise exceptions.InvalidArgumentError(
            "process set %d does not exist (was it removed, or not added on every rank?)" % set_id
        )


def _reduce_many(tensors, names, op, prescale, postscale, process_set):
    """Differentiable allreduce of a list: grad_i = the same allreduce of dy_i. In a graph, one
    tf.custom_gradient per tensor: a custom_gradient passes all its outputs through one
    IdentityN, so every result would wait for the group's last allreduce (and an optimizer
    could update no variable before every gradient is reduced)."""
    _check_set_exists(process_set)
    if len(tensors) > 1 and not tf.executing_eagerly():
        return [
            _reduce_many([t], [n], op, prescale, postscale, process_set)[0] for t, n in zip(tensors, names)
        ]
    grad_names = _grad_namer(names)
    return _differentiable(
        lambda xs: raw_ops.allreduce(xs, names, op, prescale, postscale, process_set),
        lambda dys: raw_ops.allreduce(dys, grad_names(), op, prescale, postscale, process_set),
        tensors,
    )


def _check_sparse(op, prescale, postscale):
    """Horovod's limits for IndexedSlices (NotImplementedError, through NotSupportedError)."""
    if op not in (dtypes.Average, dtypes.Sum):
        raise exceptions.NotSupportedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale != 1.0 or postscale != 1.0:
        raise exceptions.NotSupportedError("Pre/postscale_factor are not supported with tf.IndexedSlices")


def _sum_duplicate_slices(tensor):
    """(values, indices) of `tensor` with the rows of each repeated index summed into one,
    indices in order of first occurrence (an input without repeats comes back as it was)."""
    indices, position = tf.unique(tensor.indices)
    values = tf.math.unsorted_segment_sum(tensor.values, position, tf.shape(indices)[0])
    return values, indices


def _sparse_allreduce(tensor, name, op, process_set):
    """IndexedSlices: each member first sums the rows of its repeated indices (an embedding
    lookup repeats ids; horovod#3328), then values and indices are allgathered (Horovod's way),
    so each row crosses the wire once per member. Average divides the values by the number
    of members. The dense value of the result is the same as without the local sum."""
    local_values, local_indices = _sum_duplicate_slices(tensor)
    values = allgather(local_values, name=name + ".values", process_set=process_set)
    indices = allgather(local_indices, name=name + ".indices", process_set=process_set)
    if op == dtypes.Average:
        values = values / tf.cast(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


def allreduce(
    tensor,
    average=None,
    device_dense='',
    device_sparse='',
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
):
    """`tensor` reduced across the process set (default: averaged); an
    IndexedSlices is allgathered instead. device_* and ignore_name_scope are
    Horovod's arguments, accepted and unused (the core picks the device)."""
    op = resolve_op(op, average)
    name = naming.auto_name("allreduce", name)
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse(op, prescale_factor, postscale_factor)
        return _sparse_allreduce(tensor, name, op, process_set)
    tensor = tf.convert_to_tensor(tensor)
    wire, ctx = compression.compress(tensor)
    out = _reduce_many([wire], [name], op, prescale_factor, postscale_factor, process_set)[0]
    return compression.decompress(out, ctx)


def grouped_allreduce(
    tensors,
    average=None,
    device_dense='',
    device_sparse='',
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    name=None,
):
    """allreduce of every tensor, submitted together (the core fuses them)."""
    op = resolve_op(op, average)
    tensors = [t if isinstance(t, tf.IndexedSlices) else tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    names = collectives_group_names("allreduce", name, len(tensors))
    out: list[Any] = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):  # allgathered, as allreduce does
            _check_sparse(op, prescale_factor, postscale_factor)
            out[i] = _sparse_allreduce(t, names[i], op, process_set)
    if dense:
        pairs = [compression.compress(tensors[i]) for i in dense]
        outs = _reduce_many(
            [w for w, _ in pairs],
            [names[i] for i in dense],
            op,
            prescale_factor,
            postscale_factor,
            process_set,
        )
        for i, o, (_, ctx) in zip(dense, outs, pairs):
            out[i] = compression.decompress(o, ctx)
    return out


def _gather_many(tensors, names, process_set):
    """Differentiable allgather of a list: grad = this member's rows of
    allreduce(dy, ALLGATHER_GRAD_OP); the members' row counts are gathered
    in the backward pass (as the torch adapter does)."""
    _check_set_exists(process_set)
    mine = tf.stack(
        [tf.shape(t, out_type=tf.int64)[0] if t.shape.rank else tf.constant(1, tf.int64) for t in tensors]
    )

    grad_names = _grad_namer(names)

    def backward(dys):
        these = grad_names()
        summed = raw_ops.allreduce(dys, these, gradients.ALLGATHER_GRAD_OP, 1.0, 1.0, process_set)
        table = raw_ops.allgather([mine[None, :]], [these[0] + ".rows"], process_set)[0]
        member = process_set.rank()
        starts = tf.reduce_sum(table[:member], axis=0)
        return [s[starts[i] : starts[i] + mine[i]] for i, s in enumerate(summed)]

    return _differentiable(lambda xs: raw_ops.allgather(xs, names, process_set), backward, tensors)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every member's `tensor` concatenated along the first dimension, in rank
    order; first dimensions may differ."""
    return _gather_many([tf.convert_to_tensor(tensor)], [naming.auto_name("allgather", name)], process_set)[0]


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Every member's tensors concatenated along the first dimension, in rank order, one
    result per tensor of `tensors`, as one group. Differentiable."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    return (
        _gather_many(tensors, collectives_group_names("allgather", name, len(tensors)), process_set)
        if tensors
        else []
    )


def _scatter_many(tensors, names, op, prescale, postscale, process_set):
    """Differentiable reducescatter: grad = allgather(dy) * reducescatter_grad_scale(...)."""
    _check_set_exists(process_set)

    grad_names = _grad_namer(names)

    def backward(dys):
        gathered = raw_ops.allgather(dys, grad_names(), process_set)
        scale = gradients.reducescatter_grad_scale(op, prescale, postscale, process_set.size())
        return [g * tf.cast(scale, g.dtype) for g in gathered]

    return _differentiable(
        lambda xs: raw_ops.reducescatter(xs, names, op, prescale, postscale, process_set), backward, tensors
    )


def reducescatter(
    tensor,
    device_dense='',
    compression=Compression.none,
    op=dtypes.Average,
    name=None,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Reduces `tensor` across members and returns this member's block of
    rows (the first rows % size members get one extra row)."""
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise exceptions.InvalidArgumentError("reducescatter needs a tensor with at least one dimension")
    wire, ctx = compression.compress(tensor)
    out = _scatter_many(
        [wire],
        [naming.auto_name("reducescatter", name)],
        resolve_op(op, None),
        prescale_factor,
        postscale_factor,
        process_set,
    )[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(
    tensors,
    device_dense='',
    compression=Compression.none,
    op=dtypes.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
):
    """Each tensor of `tensors` reduced (default: averaged) across the process set, as one
    group; returns this member's block of rows of each. Differentiable."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    if any(t.shape.rank == 0 for t in tensors):
        raise exceptions.InvalidArgumentError("reducescatter needs tensors with at least one dimension")
    pairs = [compression.compress(t) for t in tensors]
    outs = _scatter_many(
        [w for w, _ in pairs],
        collectives_group_names("reducescatter", name, len(tensors)),
        resolve_op(op, None),
        prescale_factor,
        postscale_factor,
        process_set,
    )
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """root_rank's (a global rank) `tensor` on every member. Gradient: the
    average of every member's upstream gradient on the root, zeros elsewhere."""
    _check_set_exists(process_set)
    tensor = tf.convert_to_tensor(tensor)
    name = naming.auto_name("broadcast", name)
    grad_names = _grad_namer([name])

    def backward(dys):
        reduced = raw_ops.allreduce(dys, grad_names(), gradients.BROADCAST_GRAD_OP, 1.0, 1.0, process_set)
        if _global_rank() == int(root_rank):
            return reduced
        # Zeros that still depend on the allreduce: a graph would otherwise drop it on this
        # rank (zeros_like of a static shape is a constant) and the root would wait forever.
        with tf.control_dependencies(reduced):
            return [tf.identity(tf.zeros_like(dys[0]))]

    return _differentiable(
        lambda xs: raw_ops.broadcast(xs, [name], int(root_rank), process_set), backward, [tensor]
    )[0]


def _global_rank():
    return topology.rank()


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` to member i and returns (output, received_splits,
    int32); without splits, an even split, and only the output (as Horovod). Gradient:
    alltoall of the upstream gradient with the received splits."""
    _check_set_exists(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise exceptions.InvalidArgumentError("alltoall needs a tensor with at least one dimension")
    name = naming.auto_name("alltoall", name)
    if splits is not None and not tf.is_tensor(splits):
        splits = [int(s) for s in splits]
    received: list[Any] = []

    def forward(xs):
        out, got = raw_ops.alltoall(xs[0], splits, name, process_set)
        received[:] = [got]
        return [out, got]

    grad_names = _grad_namer([name])

    def backward(dys):
        return [raw_ops.alltoall(dys[0], received[0], grad_names()[0], process_set)[0]]

    out, got = _differentiable(forward, backward, [tensor])
    return (out, got) if splits is not None else out


def join():
    """This rank has no more data: it takes part in the others' allreduces
    with identity values until every rank has joined (other collectives fail
    meanwhile, as in Horovod); returns the last rank to join."""
    return ops.join()


def barrier(process_set=global_process_set):
    """Returns once every member of the process set has called barrier()."""
    collectives.barrier(process_set)


# horovod.tensorflow.mpi_ops also carries the topology, capability, process-set and query names
# (scripts import them from there); they are the very objects hvdlite.tensorflow exports.
from hvdlite.common import capabilities as _capabilities  # noqa: E402
from hvdlite.common.basics import *  # noqa: E402, F403 (init, rank, ..., is_homogeneous: basics.__all__)
from hvdlite.common.dtypes import Adasum, Average, Max, Min, Product, Sum  # noqa: E402, F401
from hvdlite.common.process_sets import ProcessSet, add_process_set, remove_process_set  # noqa: E402, F401
from hvdlite.common.util import (  # noqa: E402, F401
    check_num_rank_power_of_2,
    get_average_backwards_compatibility_fun,
    gpu_available,
    handle_average_backwards_compatibility,
    num_rank_is_power_2,
)
from hvdlite.tensorflow.queries import (  # noqa: E402, F401
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)

# mpi_built, nccl_built, ...: every public function of hvdlite.common.capabilities.
globals().update(
    {k: v for k, v in vars(_capabilities).items() if k.endswith(("_built", "_enabled", "_supported"))}
)
