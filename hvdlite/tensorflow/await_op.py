"""The HvdliteAwait kernel (await_op.cc): waits for hvdlite operations in a TensorFlow
graph without holding an executor thread.

``load()`` returns the loaded op module, or None when the library was not built
(setup.py builds it against the installed TensorFlow; see ``unavailable_reason()``).
Without it, graph-mode collectives block an executor thread while they wait
(hvdlite.tensorflow.buffers), so a graph with more independent collectives than
inter-op threads may hang when ranks run them in different orders.

``exclusive(tensor)``: the library's HvdliteExclusive op (a buffer no other tensor shares,
the input's own when TensorFlow can forward it), or None when the loaded library predates it.
"""

import os
import threading

import tensorflow as tf

from hvdlite.common import ops

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
    ctypes.CDLL(LIBRARY).hvdlite_tf_set_core(ctypes.c_void_p(wait), ctypes.c_void_p(poll))
    return {"module": module}
