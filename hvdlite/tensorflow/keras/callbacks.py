"""Horovod's Keras callbacks, for the Keras that tf.keras is (Keras 3, or Keras 2 as tf_keras
under TF_USE_LEGACY_KERAS: hvdlite/tensorflow/_keras.py chooses).

  BroadcastGlobalVariablesCallback(root_rank)  model (at train begin) and
      model + optimizer variables (after the first batch, once the optimizer
      has created them) take root_rank's values.
  MetricAverageCallback()  every numeric value in the epoch's logs becomes
      its average over ranks (put it before callbacks that read metrics).
  LearningRateScheduleCallback(initial_lr, multiplier, ...)  lr =
      initial_lr * multiplier(epoch) for start_epoch <= epoch < end_epoch,
      per epoch (staircase) or per batch with a fractional epoch.
  LearningRateWarmupCallback(initial_lr, warmup_epochs, ...)  lr ramps from
      initial_lr / size to initial_lr over warmup_epochs (Goyal et al.).

Every callback refuses (in set_model, before training starts) a model of the other Keras
package, with the fix. momentum_correction is accepted for Horovod compatibility and has no
effect: Keras 3 and Keras 2's Optimizer read momentum as a constant when the train step is
traced.
"""

from typing import Any

import numpy as np

from hvdlite.common import basics, collectives, dtypes, exceptions
from hvdlite.common.numpy_buffers import NUMPY
from hvdlite.tensorflow import _keras
from hvdlite.tensorflow.functions import broadcast_variables

keras: Any = _keras.get()
_KerasCallback: Any = keras.callbacks.Callback


class Callback(_KerasCallback):
    """Base of hvdlite's Keras callbacks: the active Keras's Callback, refusing a model of the
    other Keras (whose fit() would fail later in Keras's own code with an unrelated message)."""

    def set_model(self, model):
        _keras.check_same_keras(model, "the model")
        super().set_model(model)


class BroadcastGlobalVariablesCallback(Callback):
    """local_variables (Horovod's): variables that keep this worker's values."""

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._local_ids = {id(v) for v in (local_variables or ())}

    def _broadcast(self, variables):
        broadcast_variables([v for v in variables if id(v) not in self._local_ids], self.root_rank)

    def on_train_begin(self, logs=None):
        if self.model.built:
            self._broadcast(self.model.variables)

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        self._broadcast(self.model.variables)
        self._broadcast(_keras.optimizer_variables(getattr(self.model, "optimizer", None)))
        self.broadcast_done = True


class MetricAverageCallback(Callback):
    """Averages the epoch's metrics (the `logs` of on_epoch_end) across ranks, so every rank
    reports the same values. `device` is Horovod's argument and is ignored."""

    def __init__(self, device=''):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        for key in sorted(logs):
            value = logs[key]
            if isinstance(value, (int, float, np.number, np.ndarray)) or hasattr(value, "numpy"):
                array = np.array(value, dtype=np.float64)
                name = "metric_average.%s" % key
                collectives.allreduce_sync(NUMPY, array, name, dtypes.Average, 1.0, 1.0, None)
                logs[key] = float(array.reshape(-1)[0])


def _get_lr(optimizer):
    return float(np.asarray(optimizer.learning_rate))


def _set_lr(optimizer, value):
    """Keras 3 and Keras 2's Optimizer hold the rate in a variable; Keras 2's OptimizerV2 in a
    hyperparameter (a float until its first step, a variable after)."""
    schedule = keras.optimizers.schedules.LearningRateSchedule
    if any(
        isinstance(x, schedule) for x in (optimizer.learning_rate, getattr(optimizer, "_learning_rate", None))
    ):
        raise exceptions.InvalidArgumentError(
            "the optimizer's learning rate is a schedule, which these callbacks cannot set"
        )
    current = optimizer.learning_rate
    if hasattr(current, "assign"):
        current.assign(value)
    else:
        optimizer.learning_rate = value


class LearningRateScheduleCallback(Callback):
    """Sets the optimizer's learning rate to initial_lr * multiplier(epoch) from start_epoch
    up to end_epoch: once per epoch (staircase), or per batch with a fractional epoch
    (staircase=False, needs steps_per_epoch). `multiplier` is a number or a function of the
    epoch; initial_lr=None reads the optimizer's rate at the start of training."""

    def __init__(
        self,
        initial_lr,
        multiplier,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=True,
        steps_per_epoch=None,
        *args,
    ):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase if callable(multiplier) else True
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None

    def _adjust(self, epoch):
        _set_lr(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise exceptions.InvalidArgumentError(
                    "steps_per_epoch is needed for a per-batch (staircase=False) schedule: pass it, "
                    "or call fit() with steps_per_epoch"
                )

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(epoch)
        else:
            self._adjust(epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's gradual warmup: over warmup_epochs, the learning rate goes from
    initial_lr / size() to initial_lr, per batch (Goyal et al., "Accurate, Large Minibatch
    SGD"); verbose > 0 prints when it is done."""

    def __init__(
        self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0
    ):
        def multiplier(epoch):
            size = basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0:
            print(
                "\nEpoch %d: finished gradual learning rate warmup to %g."
                % (epoch + 1, _get_lr(self.model.optimizer))
            )
