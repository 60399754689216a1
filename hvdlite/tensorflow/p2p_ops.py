"""Point-to-point send and receive of TensorFlow tensors (the policy lives in
hvdlite/common/p2p.py). Values travel as NumPy arrays through the NumPy buffer
adapter. ``recv`` cannot write into an immutable tf.Tensor: it returns a new tensor
holding the message (of `tensor`'s shape and dtype), and assigns it when `tensor` is
a tf.Variable. Inside a tf.function both run as one blocking numpy_function each;
the async forms and ``synchronize`` are for eager code."""

import numpy as np
import tensorflow as tf

from hvdlite.common import collectives, ops, p2p
from hvdlite.common.numpy_buffers import NUMPY
from hvdlite.common.p2p import P2POp
from hvdlite.common.process_sets import global_process_set
from hvdlite.tensorflow.buffers import call_numpy, to_numpy, to_tensor

__all__ = ["P2POp", "batch_isend_irecv", "poll", "recv", "recv_async", "send", "send_async", "synchronize"]


def _deliver(tensor, array):
    if isinstance(tensor, tf.Variable):
        tensor.assign(array)
        return tensor
    return to_tensor(array)


def _post(kind, tensor, peer, tag, process_set, name):
    if kind == p2p.SEND:
        return p2p.post(NUMPY, kind, np.ascontiguousarray(to_numpy(tensor)), peer, tag, process_set, name)
    array = np.empty(tuple(tensor.shape), dtype=tensor.dtype.as_numpy_dtype)
    pending = p2p.post(NUMPY, kind, array, peer, tag, process_set, name)
    return collectives.Pending(pending.core, lambda: _deliver(tensor, pending.finish()), pending.keepalive)


def send_async(tensor, dst, tag=0, process_set=global_process_set, name=None):
    """Posts a send of `tensor` to rank `dst` of `process_set` (eager); synchronize()
    returns None once it is handed to the core. Never waits for the receiver."""
    return collectives.start(_post(p2p.SEND, tensor, dst, tag, process_set, name))


def recv_async(tensor, src, tag=0, process_set=global_process_set, name=None):
    """Posts a receive of a message shaped like `tensor` from rank `src` (eager);
    synchronize() returns the received tensor (assigned into `tensor` if a Variable)."""
    return collectives.start(_post(p2p.RECV, tensor, src, tag, process_set, name))


def synchronize(handle):
    """Waits for a send_async / recv_async handle and returns its result."""
    return ops.synchronize(handle)


def poll(handle):
    """True when the operation behind `handle` has completed."""
    return ops.poll(handle)


def send(tensor, dst, tag=0, process_set=global_process_set, name=None):
    """Sends `tensor` to rank `dst` of `process_set`. Eager: returns None; in a
    tf.function: returns an int32 scalar op that runs the send."""
    if tf.executing_eagerly():
        return synchronize(send_async(tensor, dst, tag, process_set, name))

    def run(array):
        p2p.run(NUMPY, p2p.SEND, np.ascontiguousarray(array), dst, tag, process_set, name)
        return [np.int32(0)]

    return call_numpy(run, [tensor], [tf.int32], [[]], "HvdliteSend")[0]


def recv(tensor, src, tag=0, process_set=global_process_set, name=None):
    """Receives a message shaped like `tensor` from rank `src` of `process_set` with
    `tag`; returns it as a tensor (and assigns it into `tensor` if a Variable)."""
    if tf.executing_eagerly():
        return synchronize(recv_async(tensor, src, tag, process_set, name))

    def run(array):
        out = np.empty(array.shape, dtype=array.dtype)
        return [p2p.run(NUMPY, p2p.RECV, out, src, tag, process_set, name)]

    value = call_numpy(run, [tf.convert_to_tensor(tensor)], [tensor.dtype], [tensor.shape], "HvdliteRecv")[0]
    return _deliver(tensor, value) if isinstance(tensor, tf.Variable) else value


def batch_isend_irecv(p2p_ops):
    """Posts every P2POp at once (eager); returns one handle per op, in order."""
    return p2p.start_group(p2p_ops, _post)
