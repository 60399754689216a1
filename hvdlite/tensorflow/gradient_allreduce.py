"""Averaging a list of gradients across ranks: the one routine behind
DistributedGradientTape, PartialDistributedGradientTape, the TensorFlow
DistributedOptimizer and the Keras DistributedOptimizer.

Policy (Horovod's, from hvdlite.common): op / gradient_predivide_factor give
the pre- and postscale factors (hvdlite.common.reduction); ``groups`` splits
the gradients into fused groups (hvdlite.common.optimizer_policy; by default
all of them form one group, submitted together); IndexedSlices are
allgathered unless sparse_as_dense; None gradients stay None. Variables
registered as worker-local (register_local_var / register_local_source, and
PartialDistributedGradientTape's local_layers) keep their own gradient, divided
by the process set's size when scale_local_gradients is True, as in Horovod.
"""

import tensorflow as tf

from hvdlite.common import dtypes
from hvdlite.common import optimizer_policy as policy
from hvdlite.common.compression import NoneCompressor
from hvdlite.common.reduction import check_predivide, gradient_scale_factors
from hvdlite.tensorflow import mpi_ops


def check_options(op, gradient_predivide_factor, num_groups, groups):
    """Validates the shared arguments; returns groups (num_groups folded in)."""
    check_predivide(op, gradient_predivide_factor)
    groups = policy.resolve_groups(num_groups, groups)
    policy.check_groups(groups, lambda v: isinstance(v, tf.Variable) or tf.is_tensor(v))
    return groups


def _index_groups(variables, count, groups):
    """Lists of gradient positions submitted together."""
    if groups is None:
        return [list(range(count))]
    if variables is None or isinstance(groups, int):
        return [
            list(chunk)
            for chunk in policy.split_list(list(range(count)), groups if isinstance(groups, int) else 1)
            if chunk
        ]
    position = {id(v): i for i, v in enumerate(variables)}
    formed = policy.form_groups(list(variables), groups)
    return [[position[id(v)] for v in group] for group in formed]


def allreduce_gradients(
    grads,
    variables=None,
    compression=None,
    sparse_as_dense=False,
    op=dtypes.Average,
    gradient_predivide_factor=1.0,
    groups=None,
    process_set=None,
    name="gradients",
):
    """Returns `grads` (a list, Nones allowed) reduced across `process_set`.
    Names are '<name>.<index>' (index in `grads`), stable across calls."""
    prescale, postscale = gradient_scale_factors(op, gradient_predivide_factor)
    out = list(grads)
    dense = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if not sparse_as_dense:
                out[i] = mpi_ops.allreduce(g, op=op, name="%s.%d" % (name, i), process_set=process_set)
                continue
            g = tf.convert_to_tensor(g)
        out[i] = g
        dense.append(i)
    wanted = set(dense)
    if getattr(compression, "stateful", False):
        wanted -= _reduce_stateful(compression, out, dense, name, op, prescale, postscale, process_set)
        compression = NoneCompressor
    # Last gradient first: the backward pass computes the gradients of the last layers first,
    # and in a graph each submission waits for its own gradient and (stateful ops run in
    # program order) for the previous submission, so this order lets every allreduce start
    # while the gradients of earlier layers are still being computed.
    for members in reversed(_index_groups(variables, len(grads), groups)):
        members = [i for i in members if i in wanted]
        if not members:
            continue
        base = "%s.%d" % (name, members[0])
        members.reverse()
        reduced = mpi_ops.grouped_allreduce(
            [out[i] for i in members],
            compression=compression,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
            name=base,
        )
        for i, r in zip(members, reduced):
            out[i] = r
    return out


def _reduce_stateful(compression, out, dense, name, op, prescale, postscale, process_set):
    """Gradients a stateful compressor (Compression.topk, .sign) takes, reduced in place in
    `out`; returns their positions (the others are reduced as they are)."""
    taken = set()
    for i in dense:
        reduced = compression.reduce("%s.%d" % (name, i), out[i], op, prescale, postscale, process_set)
        if reduced is not None:
            out[i] = reduced
            taken.add(i)
    return taken


def make_settings(
    compression,
    sparse_as_dense,
    op,
    gradient_predivide_factor,
    groups,
    process_set,
    scale_local_gradients=True,
    local_vars=(),
):
    """The settings a distributed tape or optimizer carries (a plain dict: Keras's attribute
    tracking leaves it alone); `groups` already checked by check_options."""
    return {
        "compression": compression,
        "sparse_as_dense": sparse_as_dense,
        "op": op,
        "predivide": gradient_predivide_factor,
        "groups": groups,
        "process_set": process_set,
        "scale_local_gradients": bool(scale_local_gradients),
        "local_ids": {id(v) for v in local_vars},
    }


def register_local(settings, var):
    """Marks `var` worker-local: its gradient is never reduced across ranks."""
    settings["local_ids"].add(id(var))


def reduce_with_settings(settings, grads, variables, name):
    """`grads` (aligned with `variables`, which may be None) reduced as `settings` say:
    gradients of worker-local variables are kept (scaled by 1/size with
    scale_local_gradients), every other one goes through allreduce_gradients. A rank outside
    the settings' process set keeps its gradients as they are (Horovod's _allreduce_cond)."""
    if not settings["process_set"].included():
        return list(grads)
    local = settings["local_ids"]
    variables = list(variables) if variables is not None else None
    shared = list(range(len(grads)))
    if variables is not None and local:
        shared = [i for i, v in enumerate(variables) if id(v) not in local]
    reduced = allreduce_gradients(
        [grads[i] for i in shared],
        None if variables is None else [variables[i] for i in shared],
        settings["compression"],
        settings["sparse_as_dense"],
        settings["op"],
        settings["predivide"],
        settings["groups"],
        settings["process_set"],
        name=name,
    )
    out = list(grads)
    for i, g in zip(shared, reduced):
        out[i] = g
    if variables is not None and local and settings["scale_local_gradients"]:
        factor = 1.0 / settings["process_set"].size()
        for i, v in enumerate(variables):
            if id(v) in local and out[i] is not None:
                out[i] = _scale(out[i], factor)
    return out


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values * tf.cast(factor, grad.values.dtype), grad.indices, grad.dense_shape
        )
    return grad * tf.cast(factor, grad.dtype)
