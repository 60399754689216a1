"""DistributedOptimizer for Keras 3 optimizers, and load_model.

The wrapped optimizer is an instance of a subclass of the original's class
whose apply() (which apply_gradients() and model.fit's train step go
through) first reduces the gradients across ranks with
hvdlite.tensorflow.gradient_allreduce. Everything else (variables, config,
serialization under the original class name) is the original optimizer's.
"""
import keras

from hvdlite.common import dtypes
from hvdlite.common.process_sets import global_process_set
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.gradient_allreduce import allreduce_gradients, check_options
from hvdlite.tensorflow.optimizer import _settings, check_backward_passes


class _KerasMixin:
    """apply() of a distributed Keras optimizer; settings in self._hvdlite_settings."""

    _hvdlite_distributed = True

    def apply(self, grads, trainable_variables=None):
        s = self._hvdlite_settings
        variables = trainable_variables
        if variables is None and self.built:
            variables = self._trainable_variables
        variables = list(variables) if variables is not None else None
        grads = allreduce_gradients(list(grads), variables, s["compression"], s["sparse_as_dense"], s["op"],
                                    s["predivide"], s["groups"], s["process_set"], name="DistributedOptimizer")
        return super().apply(grads, variables)


def _distributed_class(base):
    return type(base.__name__, (_KerasMixin, base), {"__module__": base.__module__})


def _attach(optimizer, settings):
    # object.__setattr__: Keras's attribute tracking has no business with a plain settings dict.
    object.__setattr__(optimizer, "_hvdlite_settings", settings)
    return optimizer


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='', compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=dtypes.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A new optimizer of `optimizer`'s class and config whose gradients are
    reduced (op, default Average) across `process_set` before each update.
    name, device_* and average_aggregated_gradients are Horovod's, accepted
    and unused."""
    groups = check_options(op, gradient_predivide_factor, num_groups, groups)
    check_backward_passes(backward_passes_per_step)
    if getattr(optimizer, "_hvdlite_distributed", False):
        raise ValueError("the optimizer is already a DistributedOptimizer")
    config = optimizer.get_config()
    new = _distributed_class(optimizer.__class__).from_config(config)
    return _attach(new, _settings(compression, sparse_as_dense, op, gradient_predivide_factor, groups,
                                  process_set))


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
        _attach(opt, _settings(compression, False, dtypes.Average, 1.0, None, global_process_set))
    return model
