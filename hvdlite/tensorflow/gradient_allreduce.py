"""Averaging a list of gradients across ranks: the one routine behind
DistributedGradientTape, PartialDistributedGradientTape, the TensorFlow
DistributedOptimizer and the Keras DistributedOptimizer.

Policy (Horovod's, from hvdlite.common): op / gradient_predivide_factor give
the pre- and postscale factors (hvdlite.common.reduction); ``groups`` splits
the gradients into fused groups (hvdlite.common.optimizer_policy; by default
all of them form one group, submitted together); IndexedSlices are
allgathered unless sparse_as_dense; None gradients stay None.
"""

import tensorflow as tf

from hvdlite.common import dtypes
from hvdlite.common import optimizer_policy as policy
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
    for members in _index_groups(variables, len(grads), groups):
        members = [i for i in members if i in wanted]
        if not members:
            continue
        reduced = mpi_ops.grouped_allreduce(
            [out[i] for i in members],
            compression=compression,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
            name="%s.%d" % (name, members[0]),
        )
        for i, r in zip(members, reduced):
            out[i] = r
    return out
