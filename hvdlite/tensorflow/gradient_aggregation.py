"""Horovod's LocalGradientAggregationHelper (horovod.tensorflow.gradient_aggregation, also
exported as hvd.LocalGradientAggregationHelper): local gradient accumulation for
backward_passes_per_step > 1 in tf.compat.v1 graphs.

Contract: compute_gradients(grads, vars) adds each gradient to a local accumulator variable and,
on every backward_passes_per_step-th run, reduces the accumulated sums with `allreduce_func(grads,
vars)` (divided by backward_passes_per_step when average_aggregated_gradients) and resets the
count; on the other runs it returns the local gradients unchanged. apply_gradients(closure,
optimizer, ...) runs `closure` only on the runs that reduced, else only advances the optimizer's
iterations / global_step. Graph construction only (TF1 sessions, or a tf.function that builds the
variables once); nothing here blocks outside the reduction it calls.
"""

from typing import Any

import tensorflow as tf

from hvdlite.common import exceptions
from hvdlite.common.process_sets import global_process_set


def apply_op_to_not_none_tensors(tensor_op, tensors, *args):
    return [tensor_op(t, *args) if t is not None else t for t in tensors]


def get_not_none_from_list(tensor_list):
    return [x for x in tensor_list if x is not None]


class LocalGradientAggregationHelper:
    """Aggregates gradient updates locally and communicates them across ranks once every
    backward_passes_per_step (Horovod's class, same constructor and methods)."""

    _OPTIMIZER_TYPE_KERAS = "optimizer_type_keras"
    _OPTIMIZER_TYPE_LEGACY = "optimizer_type_legacy"

    def __init__(
        self,
        backward_passes_per_step,
        allreduce_func,
        sparse_as_dense,
        average_aggregated_gradients,
        rank,
        optimizer_type,
        process_set=global_process_set,
        scale_local_gradients=True,
        name="",
    ):
        if backward_passes_per_step <= 0:
            raise exceptions.InvalidArgumentError("backward_passes_per_step must be > 0")
        self._allreduce_grads = allreduce_func
        self.name = name
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self.locally_aggregated_grads = []
        self.counter: Any = None  # a tf.compat.v1 variable once compute_gradients() built it
        self.sparse_as_dense = sparse_as_dense
        self.rank = rank
        self.optimizer_type = optimizer_type
        self.not_none_indexes = {}
        self.num_none_grad_updates = 0
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_vars = set()

    def register_local_var(self, var):
        """`var` is worker-local: its gradient is not reduced (divided by the process set's size
        when scale_local_gradients)."""
        self._local_vars.add(var.ref())

    def _maybe_convert_grad(self, grad):
        if isinstance(grad, tf.IndexedSlices):
            if self.sparse_as_dense:
                return tf.convert_to_tensor(grad)
            raise exceptions.InvalidArgumentError(
                "IndexedSlices are not supported when `backward_passes_per_step` > 1 and "
                "`sparse_as_dense` is False."
            )
        return grad

    def _init_aggregation_vars(self, grads):
        """The counter and one accumulator variable per not-None gradient (local variables)."""
        scope = "aggregation_variables_" + self.name + str(self.rank)
        local = tf.compat.v1.GraphKeys.LOCAL_VARIABLES
        with tf.compat.v1.variable_scope(scope, reuse=tf.compat.v1.AUTO_REUSE):
            self.counter = tf.compat.v1.get_variable(
                "aggregation_counter",
                shape=(),
                dtype=tf.int32,
                trainable=False,
                initializer=tf.compat.v1.zeros_initializer(),
                collections=[local],
            )
            for idx, grad in enumerate(grads):
                grad = self._maybe_convert_grad(grad)
                if grad is None:
                    self.num_none_grad_updates += 1
                    continue
                self.not_none_indexes[idx] = len(self.locally_aggregated_grads)
                zero = tf.zeros(shape=grad.get_shape().as_list(), dtype=grad.dtype)
                self.locally_aggregated_grads.append(
                    tf.compat.v1.get_variable(
                        str(idx),
                        trainable=False,
                        initializer=zero,
                        collections=[local, "aggregating_collection"],
                    )
                )
        if self.optimizer_type == self._OPTIMIZER_TYPE_KERAS:
            session = tf.compat.v1.keras.backend.get_session(op_input_list=())
            session.run(
                tf.compat.v1.variables_initializer(
                    [self.counter, *get_not_none_from_list(self.locally_aggregated_grads)]
                )
            )

    def _clear_grads(self):
        return tf.group(*[g.assign(g.initial_value) for g in self.locally_aggregated_grads])

    def _aggregate_grads(self, grads):
        grads = get_not_none_from_list(grads)
        ops = []
        for acc, grad in zip(self.locally_aggregated_grads, grads):
            if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
                grad = tf.convert_to_tensor(grad)
            ops.append(acc.assign_add(grad))
        return ops

    def _filtered_reduce(self, grads, variables):
        """allreduce_func over the gradients of shared variables; local ones kept (scaled)."""
        v2g = {v.ref(): g for v, g in zip(variables, grads)}
        shared = [v for v in variables if v.ref() not in self._local_vars]
        reduced = self._allreduce_grads([v2g[v.ref()] for v in shared], shared)
        for v, g in zip(shared, reduced):
            v2g[v.ref()] = g
        if self.scale_local_gradients and self._local_vars:
            for ref in list(v2g):
                if ref in self._local_vars and v2g[ref] is not None:
                    v2g[ref] = v2g[ref] / self.process_set.size()
        return [v2g[v.ref()] for v in variables]

    def _allreduce_grads_helper(self, variables):
        aggregated = [acc.read_value() for acc in self.locally_aggregated_grads]
        with tf.control_dependencies([tf.group(*aggregated)]):
            reduced = self._filtered_reduce(aggregated, variables)
            with tf.control_dependencies([g.op for g in reduced if g is not None]):
                reset = self.counter.assign(tf.constant(0), use_locking=True)
            with tf.control_dependencies([reset]):
                divisor = self.backward_passes_per_step if self.average_aggregated_gradients else 1
                return apply_op_to_not_none_tensors(tf.divide, reduced, divisor)

    def compute_gradients(self, grads, vars):
        """Accumulates grads; every backward_passes_per_step-th run returns the reduced sums."""
        self._init_aggregation_vars(grads)
        clear = tf.cond(pred=tf.equal(self.counter, 0), true_fn=self._clear_grads, false_fn=tf.no_op)
        with tf.control_dependencies([clear]):
            aggregation = tf.group(*self._aggregate_grads(grads))
        with tf.control_dependencies([aggregation]):
            update_counter = self.counter.assign_add(tf.constant(1))
        with tf.control_dependencies([update_counter]):
            present = get_not_none_from_list(grads)
            out = tf.cond(
                tf.equal(self.counter, self.backward_passes_per_step),
                lambda: self._allreduce_grads_helper(vars),
                lambda: [self._maybe_convert_grad(g) for g in present],
            )
            if not isinstance(out, (list, tuple)):
                out = (out,)
            total = len(self.locally_aggregated_grads) + self.num_none_grad_updates
            return [
                out[self.not_none_indexes[i]] if i in self.not_none_indexes else None for i in range(total)
            ]

    def apply_gradients(self, apply_grads_closure, optimizer, *args, **kwargs):
        """Runs apply_grads_closure on the runs that reduced; on the others only increments the
        optimizer's iterations and kwargs' global_step."""
        flat = [item for pair in args[0] for item in pair]

        def increment_optimizer_iteration():
            if getattr(optimizer, "iterations", None) is not None:
                return optimizer.iterations.assign_add(1).op
            return tf.no_op()

        with tf.control_dependencies([tf.group(*get_not_none_from_list(flat))]):
            train_op = tf.cond(
                pred=tf.equal(self.counter, 0),
                true_fn=apply_grads_closure,
                false_fn=increment_optimizer_iteration,
            )

        def increment_global_step_counter():
            step = kwargs.get("global_step")
            if step is None:
                return tf.no_op()
            return step.assign_add(tf.constant(1, dtype=tf.int64), use_locking=True, read_value=False)

        with tf.control_dependencies([train_op]):
            return tf.cond(
                pred=tf.equal(self.counter, 0), true_fn=tf.no_op, false_fn=increment_global_step_counter
            )
