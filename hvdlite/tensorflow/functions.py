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


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Horovod's TF1 SessionRunHook (MonitoredTrainingSession, Estimator): once the session is
    created, every global variable gets root_rank's value. The broadcast op is built in begin()
    for the graph being finalized (again if the hook is reused with another graph) and run once
    in after_create_session(), which blocks until every rank has run it. `device` is Horovod's
    placement argument."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self):
        if not self.bcast_op or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's TF1 helper: a function obj -> root_rank's obj (`session` is accepted and
    unused: the object collectives run outside the graph)."""
    base = name or "broadcast_object_fn"

    def _bcast(obj):
        return broadcast_object(obj, root_rank, name=naming.auto_name(base, None), process_set=process_set)

    return _bcast


__all__ = [
    "BroadcastGlobalVariablesHook",
    "allgather_object",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
]
