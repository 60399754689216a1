"""broadcast_variables, plus the object collectives shared with every adapter
(hvdlite.common.objects)."""

import tensorflow as tf

from hvdlite.common import naming
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


__all__ = [
    "allgather_object",
    "broadcast_object",
    "broadcast_variables",
]
