"""Horovod's horovod.tensorflow.util helpers that user code and Horovod's own tests import."""

import tensorflow as tf


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
