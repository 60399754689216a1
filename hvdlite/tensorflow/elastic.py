"""hvdlite.tensorflow.elastic: Horovod's horovod.tensorflow.elastic for TensorFlow 2 (eager).

`TensorFlowKerasState(model, optimizer=None, **kwargs)` and `TensorFlowState(variables, **kwargs)`
save/restore their variables in host memory and sync them from rank 0 (broadcast_variables);
run() is hvdlite.elastic's run, which also maps a collective failure raised inside a
tf.function (TensorFlow wraps it in an OpError) back to HorovodInternalError.
"""

import functools
import re

import tensorflow as tf

from hvdlite.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, InvalidArgumentError
from hvdlite.common.objects import broadcast_object
from hvdlite.common.topology import rank
from hvdlite.elastic.state import ObjectState, State, run_fn
from hvdlite.tensorflow import _keras
from hvdlite.tensorflow.functions import broadcast_variables

# What a collective failure looks like once TensorFlow has wrapped it in an OpError:
# - from a numpy_function, the message names hvdlite's exception;
# - from the native kernels (await_op.cc: a lost peer is Aborted, a timeout DeadlineExceeded,
#   anything unexpected Internal), the error comes from a node named Hvdlite*.
_INTERNAL_NAMES = ("HvdliteInternalError", "HvdliteTimeoutError")
_NATIVE_FAILURES = (tf.errors.AbortedError, tf.errors.DeadlineExceededError, tf.errors.InternalError)
_NATIVE_NODE = re.compile(r"\{\{node [^}]*Hvdlite")


def _is_collective_failure(error):
    message = str(error.message)
    if any(name in message for name in _INTERNAL_NAMES):
        return True
    return isinstance(error, _NATIVE_FAILURES) and _NATIVE_NODE.search(message) is not None


def run(func):
    """Decorator running ``func(state, ...)`` elastically (see hvdlite.elastic.run)."""

    @functools.wraps(func)
    def unwrap_op_errors(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if _is_collective_failure(e):
                raise HorovodInternalError(str(e.message)) from e
            raise

    return run_fn(unwrap_op_errors)


class _VariablesState(ObjectState):
    """ObjectState plus a list of variables (returned by self._variables())."""

    def _variables(self):
        raise InvalidArgumentError("%s must define _variables()" % type(self).__name__)

    def _save_variables(self):
        self._saved_values = [v.numpy() for v in self._variables()]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for var, value in zip(self._variables(), self._saved_values):
            var.assign(value)
        super().restore()

    def sync(self):
        broadcast_variables(self._variables(), root_rank=0)
        self._save_variables()
        super().sync()


class TensorFlowKerasState(_VariablesState):
    """State of a built Keras model and its optimizer (default: the model's compiled one)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if hasattr(model, "build") and not model.built:
            raise InvalidArgumentError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or getattr(model, "optimizer", None)
        self.backend = backend
        self._save_variables()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self):
        # A Keras optimizer creates its variables at its first step; build it first so a new
        # worker broadcasts the same variables as the ranks that have trained.
        opt = self.optimizer
        if opt is not None:
            _keras.build_optimizer(opt, self.model.trainable_variables)
        return list(self.model.variables) + _keras.optimizer_variables(opt)


class TensorFlowState(_VariablesState):
    """State of a list of tf.Variables (eager TensorFlow 2)."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None:
            raise InvalidArgumentError(
                "TensorFlowState needs variables= in TensorFlow 2 (there are no global variables)"
            )
        self.variables = list(variables)
        self.session = session
        self._save_variables()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self):
        return self.variables


__all__ = [
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TensorFlowKerasState",
    "TensorFlowState",
    "run",
]
