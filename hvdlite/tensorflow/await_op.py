"""The HvdliteAwait kernel (await_op.cc): waits for hvdlite operations in a TensorFlow
graph without holding an executor thread.

``load()`` returns the loaded op module, or None when the library was not built
(setup.py builds it against the installed TensorFlow; see ``unavailable_reason()``).
Without it, graph-mode collectives block an executor thread while they wait
(hvdlite.tensorflow.buffers), so a graph with more independent collectives than
inter-op threads may hang when ranks run them in different orders.

``exclusive(tensor)``: the library's HvdliteExclusive op (a buffer no other tensor shares,
the input's own when TensorFlow can forward it), or None when the loaded library predates it.

``allreduce(tensor, ...)``: the in-place allreduce of one tensor as two native ops,
HvdliteAllreduceSubmit and HvdliteAwait(release=True) (no Python call when the graph runs),
or None when the loaded library predates them. The caller resolves every argument (name,
core reduce op, scale factors, process set id); the core's dtype code comes from the shared
NumPy table (hvdlite.common.numpy_buffers), so neither op nor this module holds policy.
"""

import os
import struct
import threading

import numpy as np
import tensorflow as tf

from hvdlite.common import ops
from hvdlite.common.numpy_buffers import NUMPY

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hvdlite_tf_ops.so")

_lock = threading.Lock()
_state: dict[str, object] = {}  # "module" once loaded, or "reason" once that failed


def load():
    """The op module with ``hvdlite_await(handles, token)``, or None."""
    with _lock:
        if "module" not in _state and "reason" not in _state:
            _state.update(_load())
        return _state.get("module")


def exclusive(tensor):
    """HvdliteExclusive(tensor) in the current graph, or None without the op (see await_op.cc:
    its only consumer must be the op that writes into it)."""
    module = load()
    if module is None or not hasattr(module, "hvdlite_exclusive"):
        return None
    return module.hvdlite_exclusive(tensor)


def allreduce(tensor, name, reduce_op, prescale, postscale, set_id):
    """The reduced `tensor` (see the module doc), or None without the native submission."""
    module = load()
    if module is None or not hasattr(module, "hvdlite_allreduce_submit"):
        return None
    code = NUMPY.dtype_code(np.empty(0, tensor.dtype.as_numpy_dtype))
    handle, started = module.hvdlite_allreduce_submit(
        tensor,
        tensor_name=name,
        reduce_op=int(reduce_op),
        prescale_bits=_bits(prescale),
        postscale_bits=_bits(postscale),
        process_set=int(set_id),
        core_dtype=int(code),
        name="HvdliteAllreduceSubmit",
    )
    out = module.hvdlite_await(handle, started, release=True, name="HvdliteAllreduce")
    _run_independently(handle.op, out.op)
    return out


def _run_independently(*graph_ops):
    """Frees the submission from tf.function's automatic control dependencies, which chain
    stateful ops in program order: each allreduce then starts as soon as its own input
    exists, in whatever order the executor computes them (ranks may differ: the core
    matches operations by name). Both ops still run before the function returns, even
    when nothing uses the result: the await must, since it keeps the buffer the core
    writes into alive and releases the handle. Graphs without automatic control
    dependencies (tf.compat.v1) have no chain to free."""
    for op in graph_ops:
        manager = getattr(op.graph, "experimental_acd_manager", None)
        if manager is not None and hasattr(manager, "run_independently"):
            manager.run_independently(op)


def _bits(value):
    """A double's bits as an int64 attribute (TensorFlow has no double attribute)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def unavailable_reason():
    """Why load() returns None ('' when it does not)."""
    load()
    return str(_state.get("reason", ""))


def _load():
    if not os.path.exists(LIBRARY):
        return {"reason": "%s was not built (TensorFlow or a C++ compiler missing at build time?)" % LIBRARY}
    try:
        module = tf.load_op_library(LIBRARY)
    except Exception as e:  # built against another TensorFlow: tf raises NotFoundError and others
        return {"reason": "cannot load %s: %s" % (LIBRARY, e)}
    import ctypes

    wait, poll = ops.native_wait_entry_points()
    library = ctypes.CDLL(LIBRARY)
    library.hvdlite_tf_set_core(ctypes.c_void_p(wait), ctypes.c_void_p(poll))
    if hasattr(library, "hvdlite_tf_set_submit"):
        enqueue, release = ops.native_entry_points("hvdlite_enqueue", "hvdlite_release")
        library.hvdlite_tf_set_submit(ctypes.c_void_p(enqueue), ctypes.c_void_p(release))
    return {"module": module}
