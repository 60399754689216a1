"""DistributedOptimizer for Keras 3 optimizers, and load_model (exported by
hvdlite.tensorflow.keras; it lives here, below both hvdlite.tensorflow and its
keras package, so that hvdlite.tensorflow.DistributedOptimizer can use it).

The wrapped optimizer is an instance of a subclass of the original's class
whose apply() (which apply_gradients() and model.fit's train step go
through) first reduces the gradients across ranks with
hvdlite.tensorflow.gradient_allreduce. Everything else (variables, config,
serialization under the original class name) is the original optimizer's.
"""

from typing import Any

import keras
import tensorflow as tf

from hvdlite.common import dtypes, exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.gradient_allreduce import (
    check_options,
    make_settings,
    reduce_with_settings,
    register_local,
)


class _KerasMixin:
    """apply() of a distributed Keras optimizer; settings (gradient_allreduce.make_settings,
    plus passes / average_aggregated) in self._hvdlite_settings."""

    _hvdlite_distributed = True
    _hvdlite_settings: dict[str, Any]
    built: bool  # keras.Optimizer's
    _trainable_variables: list[Any]  # keras.Optimizer's

    def apply(self, grads, trainable_variables=None):
        s = self._hvdlite_settings
        variables = trainable_variables
        if variables is None and self.built:
            variables = self._trainable_variables
        variables = list(variables) if variables is not None else None
        if s["passes"] > 1:
            return _accumulate(self, list(grads), variables)
        # super() is the wrapped optimizer's class (see _distributed_class); keras is untyped.
        return super().apply(_reduce(s, list(grads), variables), variables)  # type: ignore[misc]

    def register_local_var(self, var):
        """Horovod's: `var` is worker-local; its gradient is not reduced (and is divided by
        the process set's size when scale_local_gradients is True)."""
        register_local(self._hvdlite_settings, var)


def _reduce(s, grads, variables):
    return reduce_with_settings(s, grads, variables, "DistributedOptimizer")


def _accumulate(opt, grads, variables):
    """backward_passes_per_step = N > 1 (Horovod's local aggregation): gradients are summed
    locally over N calls; every N-th call reduces the sum (divided by N with
    average_aggregated_gradients) across ranks and applies it. Other calls change no model
    variable. Every rank takes the same branch (the call counter is the same everywhere)."""
    s = opt._hvdlite_settings
    if "accumulators" not in s:
        with tf.init_scope():
            s["accumulators"] = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
            s["calls"] = tf.Variable(0, dtype=tf.int64, trainable=False)
    if not opt.built:
        opt.build(variables)
    for acc, g in zip(s["accumulators"], grads):
        if g is not None:
            acc.assign_add(tf.convert_to_tensor(g))
    s["calls"].assign_add(1)

    def flush():
        scale = 1.0 / s["passes"] if s["average_aggregated"] else 1.0
        summed = [
            acc.read_value() * scale if g is not None else None for acc, g in zip(s["accumulators"], grads)
        ]
        super(_KerasMixin, opt).apply(_reduce(s, summed, variables), variables)
        for acc in s["accumulators"]:
            acc.assign(tf.zeros_like(acc))
        return tf.constant(True)

    due = tf.equal(s["calls"] % s["passes"], 0)
    if tf.executing_eagerly():
        return flush() if bool(due) else tf.constant(False)
    return tf.cond(due, flush, lambda: tf.constant(False))


def _distributed_class(base):
    return type(base.__name__, (_KerasMixin, base), {"__module__": base.__module__})


def _attach(optimizer, settings):
    # object.__setattr__: Keras's attribute tracking has no business with a plain settings dict.
    object.__setattr__(optimizer, "_hvdlite_settings", settings)
    return optimizer


def DistributedOptimizer(
    optimizer,
    name=None,
    device_dense='',
    device_sparse='',
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=dtypes.Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """A new optimizer of `optimizer`'s class and config whose gradients are
    reduced (op, default Average) across `process_set` before each update
    (every backward_passes_per_step-th call, see _accumulate). name and
    device_* are Horovod's, accepted and unused. Gradients of variables
    registered with register_local_var() are not reduced and, with
    scale_local_gradients, divided by the process set's size."""
    groups = check_options(op, gradient_predivide_factor, num_groups, groups)
    if int(backward_passes_per_step) < 1:
        raise exceptions.InvalidArgumentError("backward_passes_per_step must be at least 1")
    if getattr(optimizer, "_hvdlite_distributed", False):
        raise exceptions.InvalidArgumentError("the optimizer is already a DistributedOptimizer")
    config = optimizer.get_config()
    new = _distributed_class(optimizer.__class__).from_config(config)
    settings = make_settings(
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        process_set,
        scale_local_gradients,
    )
    settings.update(
        passes=int(backward_passes_per_step), average_aggregated=bool(average_aggregated_gradients)
    )
    return _attach(new, settings)


def PartialDistributedOptimizer(optimizer, name=None, local_layers=None, **kwargs):
    """A DistributedOptimizer (same keyword arguments) whose `local_layers`' (a layer or
    a list of layers) trainable variables are worker-local, as if registered with
    register_local_var() (Horovod's)."""
    opt = DistributedOptimizer(optimizer, name=name, **kwargs)
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """keras.models.load_model, with the model's optimizer (state included)
    turned into a DistributedOptimizer in place. custom_optimizers: optimizer
    classes the file may name, besides Keras's own."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not getattr(opt, "_hvdlite_distributed", False):
        opt.__class__ = _distributed_class(opt.__class__)
        settings = make_settings(compression, False, dtypes.Average, 1.0, None, global_process_set)
        _attach(opt, dict(settings, passes=1, average_aggregated=False))
    return model
