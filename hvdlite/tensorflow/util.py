"""Horovod's horovod.tensorflow.util helpers that user code and Horovod's own tests import."""

import threading
from typing import Any

import tensorflow as tf

from hvdlite.common.util import register_gpu_check


def _executing_eagerly():
    """True when TensorFlow runs eagerly here (not while tracing a graph)."""
    return tf.executing_eagerly()


def vars_to_refs(vars):
    """Hashable references of TensorFlow variables (Horovod's helper)."""
    if isinstance(vars, list):
        return tuple(vars_to_refs(v) for v in vars)
    return vars.ref()


def refs_to_vars(refs):
    """The variables behind vars_to_refs()'s references."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()


def _make_subgraph(f):
    """Horovod's: f as a tf.function."""
    return tf.function(f)


def _cache(f):
    """Horovod's memoizer: f(*args) computed once per (args, executing eagerly or not); args must
    be hashable. Thread-safe: concurrent first calls may compute twice, one result is kept."""
    cache: dict[Any, Any] = {}
    lock = threading.Lock()

    def wrapper(*args):
        key = (args, _executing_eagerly())
        with lock:
            if key in cache:
                return cache[key]
        value = f(*args)
        with lock:
            return cache.setdefault(key, value)

    return wrapper


def _check_has_gpu():
    """Whether TensorFlow sees a GPU (Horovod's extension hook behind hvd.gpu_available)."""
    return bool(tf.config.list_physical_devices("GPU"))


register_gpu_check("tensorflow", _check_has_gpu)
