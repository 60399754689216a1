"""hvdlite.tensorflow.keras.elastic: Horovod's horovod.tensorflow.keras.elastic, for the Keras
that tf.keras is (Keras 3, or Keras 2 under TF_USE_LEGACY_KERAS)::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(data, steps_per_epoch=..., epochs=epochs - state.epoch, callbacks=[
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            hvd.elastic.CommitStateCallback(state, batches_per_commit=1)])

    train(state)
"""

from hvdlite.tensorflow import _keras
from hvdlite.tensorflow.elastic import TensorFlowKerasState, run
from hvdlite.tensorflow.keras.callbacks import Callback


class KerasState(TensorFlowKerasState):
    """State of a built Keras model and its optimizer (default: the compiled one)."""

    def __init__(self, model, optimizer=None, **kwargs):
        _keras.check_same_keras(model, "the model")
        super().__init__(model, optimizer=optimizer, backend=_keras.get().backend, **kwargs)


class CommitStateCallback(Callback):
    """Commits `state` every `batches_per_commit` batches and at the end of every epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same on every rank after a reset

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(Callback):
    """Keeps state.batch = the last finished batch of the epoch (0 after each epoch); with
    steps_per_epoch, the first epoch after a reset is shortened by the batches already done."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        steps = self.params.get("steps") if self.params else None
        if steps:
            if self.steps_per_epoch is None:
                self.steps_per_epoch = steps
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(Callback):
    """Keeps state.epoch = epochs finished in the whole job (Keras counts from 0 at every fit)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = [
    "CommitStateCallback",
    "KerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]
