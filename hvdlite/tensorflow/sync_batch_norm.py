"""SyncBatchNormalization: Keras batch normalization whose training-mode batch statistics
are taken over the whole process set (Horovod's, horovod.tensorflow.SyncBatchNormalization).

Each worker's mean and mean of squares are summed across ranks (one allreduce per call,
named at trace time in call order, so ranks agree) and divided by the number of ranks:
Var[X] = E[X^2] - E[X]^2 over the equal-sized per-worker batches, as Horovod computes it.

One class for the Keras that tf.keras is (hvdlite/tensorflow/_keras.py): both call _moments()
for the batch moments (with different arguments); Keras 2 only with fused=False, which is
forced, as Horovod does.
Keras 2 arguments that Keras 3 lacks (fused, virtual_batch_size, adjustment) are accepted and,
under Keras 3, ignored: the result does not depend on them.
"""

from typing import Any

import tensorflow as tf

from hvdlite.common import dtypes, exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.tensorflow import _keras, mpi_ops

_KERAS2_ONLY = ("fused", "virtual_batch_size", "adjustment")
_BatchNormalization: Any = _keras.get().layers.BatchNormalization


class SyncBatchNormalization(_BatchNormalization):
    """Keras BatchNormalization whose training-mode batch mean and variance are taken over
    every rank of `process_set` (Horovod's SyncBatchNormalization; module docstring)."""

    def __init__(self, *args, process_set=global_process_set, **kwargs):
        if _keras.is_keras3():
            for name in _KERAS2_ONLY:
                kwargs.pop(name, None)
        else:
            if kwargs.get("fused"):
                raise exceptions.InvalidArgumentError("SyncBatchNormalization does not support fused=True")
            kwargs["fused"] = False
        super().__init__(*args, **kwargs)
        self._hvdlite_process_set = process_set

    def _moments(self, inputs, *args, **kwargs):
        # Keras 3 calls _moments(inputs, mask); Keras 2 _moments(inputs, reduction_axes,
        # keep_dims=, mask=). Both return this worker's (mean, variance).
        mean, variance = super()._moments(inputs, *args, **kwargs)
        return self._group_moments(mean, variance)

    def _group_moments(self, mean, variance):
        process_set = self._hvdlite_process_set
        if process_set.size() <= 1:
            return mean, variance
        mean_of_square = variance + tf.math.square(mean)
        stacked = mpi_ops.allreduce(
            tf.stack([mean, mean_of_square]), op=dtypes.Sum, process_set=process_set
        ) / tf.cast(process_set.size(), mean.dtype)
        group_mean, group_mean_of_square = tf.unstack(stacked)
        return group_mean, group_mean_of_square - tf.math.square(group_mean)
