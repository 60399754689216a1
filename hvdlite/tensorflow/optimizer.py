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
from hvdlite.common.topology import rank
from hvdlite.tensorflow import _keras
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
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
        grads = [g for g, _ in pairs]
        agg = self._hvdlite.get("aggregation")
        if agg is not None:  # backward_passes_per_step > 1: reduce every N-th run
            return list(zip(agg.compute_gradients(grads, variables), variables))
        grads = reduce_with_settings(self._hvdlite, grads, variables, "DistributedOptimizer")
        return list(zip(grads, variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        agg = self._hvdlite.get("aggregation")
        apply = super().apply_gradients  # type: ignore[misc]
        if agg is None:
            return apply(grads_and_vars, global_step=global_step, name=name)
        return agg.apply_gradients(
            lambda: apply(grads_and_vars, global_step=global_step, name=name),
            self,
            grads_and_vars,
            global_step=global_step,
            name=name,
        )

    def register_local_var(self, var):
        """Horovod's: `var` is worker-local; its gradient is not reduced (and is divided by
        the process set's size when scale_local_gradients is True)."""
        register_local(self._hvdlite, var)


def _aggregation(settings, backward_passes_per_step, sparse_as_dense, average_aggregated, name):
    """Horovod's LocalGradientAggregationHelper for backward_passes_per_step > 1 (tf.compat.v1
    graphs only, as in Horovod), reducing with `settings`; None for 1."""
    if backward_passes_per_step == 1:
        return None
    if tf.executing_eagerly():
        raise exceptions.InvalidArgumentError(
            "backward_passes_per_step > 1 is not yet supported for _LegacyOptimizer with eager "
            "execution (build the training step in a tf.compat.v1 graph, or use a Keras optimizer)"
        )
    return LocalGradientAggregationHelper(
        backward_passes_per_step=backward_passes_per_step,
        allreduce_func=lambda grads, variables: reduce_with_settings(
            settings, grads, variables, "DistributedOptimizer"
        ),
        sparse_as_dense=sparse_as_dense,
        average_aggregated_gradients=average_aggregated,
        rank=rank(),
        optimizer_type=LocalGradientAggregationHelper._OPTIMIZER_TYPE_LEGACY,
        process_set=settings["process_set"],
        name=name,
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
    are Horovod's, accepted and unused; backward_passes_per_step > 1 accumulates
    gradients locally and reduces every N-th step (tf.compat.v1 optimizers: in graphs
    only, through LocalGradientAggregationHelper, as Horovod).
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
    cls = type(optimizer.__class__.__name__, (_V1Mixin, optimizer.__class__), {})
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._optimizer = optimizer  # Horovod's attribute: the optimizer it wraps
    wrapped._hvdlite = make_settings(
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        process_set,
        scale_local_gradients,
    )
    wrapped._hvdlite["aggregation"] = _aggregation(
        wrapped._hvdlite,
        backward_passes_per_step,
        sparse_as_dense,
        average_aggregated_gradients,
        name or "Distributed" + type(optimizer).__name__,
    )
    return wrapped
