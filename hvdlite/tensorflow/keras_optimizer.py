"""DistributedOptimizer for Keras optimizers, and load_model (exported by
hvdlite.tensorflow.keras; it lives here, below both hvdlite.tensorflow and its
keras package, so that hvdlite.tensorflow.DistributedOptimizer can use it).

Works with the Keras that tf.keras is (hvdlite/tensorflow/_keras.py): Keras 3's
optimizers, and Keras 2's (tf_keras) Optimizer and legacy OptimizerV2. The wrapped
optimizer is an instance of a subclass of the original's class (same name, so a
saved model loads without hvdlite) with:

- Horovod's compute_gradients / _compute_gradients / get_gradients (Keras 2's
  minimize() and model.fit go through them): local gradients, reduced across ranks;
- the apply step (Keras 3's apply(), which apply_gradients() and model.fit use;
  Keras 2's apply_gradients()): reduces gradients that did not come reduced from
  the methods above, and with backward_passes_per_step > 1 accumulates them.

The version difference is only which apply method is hooked (_ApplyHook /
_ApplyGradientsHook); both end in _step(). All reduction goes through
hvdlite.tensorflow.gradient_allreduce (one policy).
"""

from typing import Any

import tensorflow as tf

from hvdlite.common import dtypes, exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.tensorflow import _keras
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.gradient_allreduce import (
    check_options,
    make_settings,
    reduce_with_settings,
    register_local,
)


class _Aggregation:
    """backward_passes_per_step > 1: per-variable sums and the count of passes since the last
    update (Horovod's opt._agg_helper.counter). Created on the first step, outside any graph."""

    def __init__(self, variables):
        with tf.init_scope():
            self.accumulators = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False)


class _DistributedMixin:
    """Horovod's methods of a distributed Keras optimizer, for every Keras. Settings
    (gradient_allreduce.make_settings, plus passes / average_aggregated) in self._hvdlite_settings."""

    _hvdlite_distributed = True
    _hvdlite_settings: dict[str, Any]

    @property
    def _agg_helper(self):
        """Horovod's name: the gradient accumulation state (None until the first step, and
        always with backward_passes_per_step=1)."""
        return self._hvdlite_settings.get("aggregation")

    def register_local_var(self, var):
        """Horovod's: `var` is worker-local; its gradient is not reduced (and is divided by
        the process set's size when scale_local_gradients is True)."""
        register_local(self._hvdlite_settings, var)

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """(gradient, variable) pairs of `loss`, reduced across ranks (with
        backward_passes_per_step > 1: local; the apply step accumulates and reduces them)."""
        pairs = _local_gradients(self, loss, var_list, grad_loss, tape)
        variables = [v for _, v in pairs]
        return list(zip(self._hvdlite_reduce_now([g for g, _ in pairs], variables), variables))

    def get_gradients(self, loss, params):
        """Keras 2 OptimizerV2's get_gradients, reduced across ranks."""
        base = super()
        if not hasattr(base, "get_gradients"):
            raise exceptions.NotSupportedError(
                "get_gradients() is Keras 2's (tf_keras OptimizerV2); this optimizer is a %s one: "
                "use compute_gradients() or apply_gradients()" % _keras.describe()
            )
        return self._hvdlite_reduce_now(base.get_gradients(loss, params), list(params))

    def _hvdlite_reduce_now(self, grads, variables):
        s = self._hvdlite_settings
        if s["passes"] > 1:
            return list(grads)
        reduced = _reduce(s, list(grads), variables)
        s["reduced"] = reduced  # the apply step applies exactly these as they are
        return reduced


class _ApplyHook:
    """Keras 3: apply() is where model.fit and apply_gradients() end."""

    built: bool  # keras.Optimizer's
    _trainable_variables: list[Any]  # keras.Optimizer's

    def apply(self, grads, trainable_variables=None):
        variables = trainable_variables
        if variables is None and self.built:
            variables = self._trainable_variables
        variables = list(variables) if variables is not None else None
        # super() is the wrapped optimizer's class (see _distributed_class); keras is untyped.
        base: Any = super()
        return _step(self, list(grads), variables, lambda g: base.apply(g, variables))


class _ApplyGradientsHook:
    """Keras 2 (tf_keras Optimizer and OptimizerV2): apply_gradients() is the apply step."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        base: Any = super()
        return _step(
            self,
            [g for g, _ in pairs],
            variables,
            lambda g: base.apply_gradients(list(zip(g, variables)), *args, **kwargs),
        )


def _local_gradients(opt, loss, var_list, grad_loss, tape):
    """The wrapped optimizer's own gradient computation (Keras 2 has one; Keras 3 has none, so
    the same is done with a GradientTape)."""
    base = super(_DistributedMixin, opt)
    if hasattr(base, "_compute_gradients"):  # Keras 2 OptimizerV2
        return base._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
    if hasattr(base, "compute_gradients"):  # Keras 2 Optimizer
        return base.compute_gradients(loss, var_list, tape=tape)
    tape = tape if tape is not None else tf.GradientTape()
    if callable(loss):
        with tape:
            if not callable(var_list):
                tape.watch(var_list)
            loss = loss()
    if callable(var_list):
        var_list = var_list()
    var_list = list(var_list)
    return list(zip(tape.gradient(loss, var_list, grad_loss), var_list))


def _reduce(s, grads, variables):
    return reduce_with_settings(s, grads, variables, "DistributedOptimizer")


def _step(opt, grads, variables, apply):
    """The apply step: `apply(grads)` calls the wrapped optimizer's own apply method."""
    s = opt._hvdlite_settings
    if s["passes"] > 1:
        return _accumulate(opt, grads, variables, apply)
    reduced = s.pop("reduced", None)
    if reduced is None or len(reduced) != len(grads) or any(a is not b for a, b in zip(reduced, grads)):
        grads = _reduce(s, grads, variables)
    return apply(grads)


def _accumulate(opt, grads, variables, apply):
    """backward_passes_per_step = N > 1 (Horovod's local aggregation): gradients are summed
    locally over N calls; every N-th call reduces the sum (divided by N with
    average_aggregated_gradients) across ranks and applies it. Other calls change no model
    variable and count one optimizer iteration (as Horovod's). Every rank takes the same branch
    (the counter is the same everywhere)."""
    s = opt._hvdlite_settings
    if "aggregation" not in s:
        s["aggregation"] = _Aggregation(variables)
    agg = s["aggregation"]
    _keras.build_optimizer(opt, variables)
    for acc, g in zip(agg.accumulators, grads):
        if g is not None:
            acc.assign_add(tf.convert_to_tensor(g))
    agg.counter.assign_add(1)

    def flush():
        scale = 1.0 / s["passes"] if s["average_aggregated"] else 1.0
        summed = [
            acc.read_value() * scale if g is not None else None for acc, g in zip(agg.accumulators, grads)
        ]
        apply(_reduce(s, summed, variables))
        for acc in agg.accumulators:
            acc.assign(tf.zeros_like(acc))
        agg.counter.assign(0)
        return tf.constant(True)

    def skip():
        opt.iterations.assign_add(1)
        return tf.constant(False)

    due = tf.equal(agg.counter, s["passes"])
    if tf.executing_eagerly():
        return flush() if bool(due) else skip()
    return tf.cond(due, flush, skip)


def _distributed_class(base):
    hook = _ApplyHook if _keras.is_keras3() else _ApplyGradientsHook
    return type(base.__name__, (hook, _DistributedMixin, base), {"__module__": base.__module__})


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
    if not _keras.is_keras_optimizer(optimizer):
        raise exceptions.InvalidArgumentError(
            "DistributedOptimizer needs a %s optimizer (tf.keras.optimizers.*), got %s"
            % (_keras.describe(), type(optimizer).__name__)
        )
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
    model = _keras.get().models.load_model(filepath, custom_objects=objects)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not getattr(opt, "_hvdlite_distributed", False):
        opt.__class__ = _distributed_class(opt.__class__)
        settings = make_settings(compression, False, dtypes.Average, 1.0, None, global_process_set)
        _attach(opt, dict(settings, passes=1, average_aggregated=False))
    return model
