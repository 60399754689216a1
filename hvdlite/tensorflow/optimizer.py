"""hvdlite.tensorflow.DistributedOptimizer (Horovod's): averages gradients
across ranks before they are applied.

A Keras optimizer (tf.keras.optimizers.*: Keras 3, or Keras 2 under TF_USE_LEGACY_KERAS) is wrapped by
hvdlite.tensorflow.keras's DistributedOptimizer; a TF1-style
tf.compat.v1.train.Optimizer gets compute_gradients() overridden. Both go
through hvdlite.tensorflow.gradient_allreduce (one policy).
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
from hvdlite.tensorflow.keras_optimizer import DistributedOptimizer as keras_distributed


class _V1Mixin:
    """compute_gradients() of a distributed tf.compat.v1.train.Optimizer; settings
    (gradient_allreduce.make_settings) in self._hvdlite."""

    _hvdlite: dict[str, Any]

    def compute_gradients(self, *args, **kwargs):
        # super() is the wrapped optimizer's class (see DistributedOptimizer); tf is untyped.
        pairs = super().compute_gradients(*args, **kwargs)  # type: ignore[misc]
        variables = [v for _, v in pairs]
        grads = reduce_with_settings(self._hvdlite, [g for g, _ in pairs], variables, "DistributedOptimizer")
        return list(zip(grads, variables))

    def register_local_var(self, var):
        """Horovod's: `var` is worker-local; its gradient is not reduced (and is divided by
        the process set's size when scale_local_gradients is True)."""
        register_local(self._hvdlite, var)


def check_backward_passes(backward_passes_per_step):
    if backward_passes_per_step != 1:
        raise exceptions.NotSupportedError(
            "backward_passes_per_step=%d: local gradient accumulation is not implemented in "
            "hvdlite.tensorflow's tf.compat.v1 optimizers yet; use 1, or a Keras optimizer"
            % backward_passes_per_step
        )


def DistributedOptimizer(
    optimizer,
    name=None,
    use_locking=False,
    device_dense='',
    device_sparse='',
    compression=Compression.none,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=dtypes.Average,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Wraps `optimizer` so that gradients are reduced (op, default Average)
    across `process_set` before being applied. name, use_locking, device_*
    are Horovod's, accepted and unused; backward_passes_per_step and
    average_aggregated_gradients apply to Keras optimizers only.
    scale_local_gradients: gradients of variables registered with
    register_local_var() are not reduced and, when True, divided by the
    process set's size (Horovod's semantics)."""
    if _keras.is_keras_optimizer(optimizer):
        return keras_distributed(
            optimizer,
            name=name,
            compression=compression,
            sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients,
            num_groups=num_groups,
            groups=groups,
            process_set=process_set,
            scale_local_gradients=scale_local_gradients,
        )
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise exceptions.InvalidArgumentError(
            "DistributedOptimizer needs a Keras optimizer or a tf.compat.v1.train.Optimizer, got %s"
            % type(optimizer).__name__
        )
    groups = check_options(op, gradient_predivide_factor, num_groups, groups)
    check_backward_passes(backward_passes_per_step)
    cls = type(optimizer.__class__.__name__, (_V1Mixin, optimizer.__class__), {})
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._hvdlite = make_settings(
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        process_set,
        scale_local_gradients,
    )
    return wrapped
