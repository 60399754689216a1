"""broadcast_variables, plus the object collectives shared with every adapter
(hvdlite.common.objects)."""

import tensorflow as tf

from hvdlite.common import exceptions, naming
from hvdlite.common.objects import allgather_object, broadcast_object
from hvdlite.common.process_sets import global_process_set
from hvdlite.tensorflow import raw_ops


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=True):
    """Assigns root_rank's value to every variable in `variables` (tf or Keras
    variables, in the same order on every rank), in one fused submission.
    Returns the assign results (ops while tracing a tf.function)."""
    variables = list(variables)
    if not variables:
        return []
    base = naming.auto_name("broadcast_variables", None)
    names = ["%s.%d" % (base, i) for i in range(len(variables))]
    values = raw_ops.broadcast(
        [tf.convert_to_tensor(v) for v in variables], names, int(root_rank), process_set
    )
    return [v.assign(value) for v, value in zip(variables, values)]


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: assigns root_rank's values to `variables` and returns
    their values read after the assignment (one fused submission)."""
    variables = list(variables)
    if not variables:
        return []
    base = naming.auto_name("broadcast_", name)
    names = ["%s.%d" % (base, i) for i in range(len(variables))]
    values = raw_ops.broadcast(
        [tf.convert_to_tensor(v) for v in variables], names, int(root_rank), process_set
    )
    assigns = [v.assign(value) for v, value in zip(variables, values)]
    with tf.control_dependencies(assigns):
        return [tf.identity(v.read_value()) for v in variables]


def broadcast_global_variables(root_rank):
    """TF1 graphs: broadcasts every global variable from root_rank (Horovod refuses it
    eagerly, where there are no global variables: use broadcast_variables)."""
    if tf.executing_eagerly():
        raise exceptions.NotSupportedError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return tf.group(*broadcast_variables(tf.compat.v1.global_variables(), root_rank))


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's TF1 helper: a function obj -> root_rank's obj (`session` is accepted and
    unused: the object collectives run outside the graph)."""
    base = name or "broadcast_object_fn"

    def _bcast(obj):
        return broadcast_object(obj, root_rank, name=naming.auto_name(base, None), process_set=process_set)

    return _bcast


__all__ = [
    "allgather_object",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
]
