"""Horovod's graph-time queries (rank_op, size_op, ...): int32 scalar tensors whose value
is read when the op runs, not when the graph is built (in a tf.function or tf.compat.v1
graph: a stateful numpy_function; eagerly: a constant). process_set_included_op gives
1 / 0, or Horovod's error codes -1 (not initialized) and -2 (unknown process set).
"""

import numpy as np
import tensorflow as tf

from hvdlite.common import exceptions, topology
from hvdlite.common.native import core as _core

PROCESS_SET_ERROR_INIT = -1
PROCESS_SET_ERROR_UNKNOWN_SET = -2


def _query(fn, name):
    if tf.executing_eagerly():
        return tf.constant(fn(), dtype=tf.int32)
    out = tf.numpy_function(lambda: np.int32(fn()), [], tf.int32, stateful=True, name=name or "HvdliteQuery")
    out.set_shape([])
    return out


def _set_ranks(process_set_id):
    ranks = _core.process_set_ranks(int(process_set_id))
    if ranks is None:
        raise exceptions.PreconditionError(
            "unknown process set %s (or hvdlite is not initialized)" % process_set_id
        )
    return ranks


def size_op(process_set_id=0, name=None):
    """The number of processes in the process set (default: the job)."""
    return _query(lambda: len(_set_ranks(process_set_id)), name)


def rank_op(name=None):
    """This process's rank."""
    return _query(topology.rank, name)


def local_rank_op(name=None):
    """This process's rank on its host."""
    return _query(topology.local_rank, name)


def local_size_op(name=None):
    """The number of processes on this host."""
    return _query(topology.local_size, name)


def _included(process_set_id):
    if _core.process_set_ranks(0) is None:
        return PROCESS_SET_ERROR_INIT
    ranks = _core.process_set_ranks(int(process_set_id))
    if ranks is None:
        return PROCESS_SET_ERROR_UNKNOWN_SET
    return int(topology.rank() in ranks)


def process_set_included_op(process_set_id=0, name=None):
    """1 if this process belongs to the process set, else 0 (or an error code, see above)."""
    return _query(lambda: _included(process_set_id), name)
