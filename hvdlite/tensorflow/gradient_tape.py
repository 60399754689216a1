"""DistributedGradientTape / PartialDistributedGradientTape: a tf.GradientTape
whose gradient() returns gradients averaged across ranks (Horovod's API).

The wrapper is an instance of a subclass of the given tape's own class that
shares the tape's recorded state (its __dict__ is copied), so isinstance
checks and every other tape method behave as before; only gradient() adds
the allreduce (hvdlite.tensorflow.gradient_allreduce).
"""

from typing import Any

import tensorflow as tf

from hvdlite.common import dtypes
from hvdlite.common.process_sets import global_process_set
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.gradient_allreduce import (
    check_options,
    make_settings,
    reduce_with_settings,
    register_local,
)


class _DistributedMixin:
    """gradient() of a distributed tape; settings (gradient_allreduce.make_settings) in self._hvdlite."""

    _hvdlite: dict[str, Any]

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False, **kwargs):
        # super() is the wrapped tape's class (see DistributedGradientTape); tf is untyped.
        grads = super().gradient(target, sources, output_gradients, **kwargs)  # type: ignore[misc]
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        out = reduce_with_settings(self._hvdlite, flat_grads, flat_sources, "DistributedGradientTape")
        return tf.nest.pack_sequence_as(sources, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """Horovod's: gradient() split into ([(source, grad)] of worker-local sources, the same for
        the others), each in the order of `sources` (a flat list)."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local = self._hvdlite["local_ids"]
        pairs = list(zip(sources, grads))
        return [p for p in pairs if id(p[0]) in local], [p for p in pairs if id(p[0]) not in local]

    def register_local_source(self, source):
        """Horovod's: `source` (a variable) is worker-local; its gradient is not reduced (and
        is divided by the process set's size when scale_local_gradients is True)."""
        register_local(self._hvdlite, source)


def DistributedGradientTape(
    gradtape,
    device_dense='',
    device_sparse='',
    compression=Compression.none,
    sparse_as_dense=False,
    op=dtypes.Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
    _local_vars=(),
):
    """Wraps `gradtape` (after its `with` block) so that gradient() averages
    (op=Average; or Sum, Adasum) the gradients across `process_set`.
    device_dense / device_sparse are Horovod's, accepted and unused."""
    groups = check_options(op, gradient_predivide_factor, num_groups, groups)
    cls = type(gradtape.__class__.__name__, (_DistributedMixin, gradtape.__class__), {})
    tape: Any = object.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hvdlite = make_settings(
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        process_set,
        scale_local_gradients,
        _local_vars,
    )
    return tape


def PartialDistributedGradientTape(
    gradtape,
    device_dense='',
    device_sparse='',
    compression=Compression.none,
    sparse_as_dense=False,
    op=dtypes.Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients=True,
):
    """A DistributedGradientTape that leaves the gradients of `local_layers`'
    trainable variables (a layer or a list of layers) un-reduced; with
    scale_local_gradients they are divided by the process set size, as in
    Horovod (the same scale as the averaged ones of a summed loss)."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    local_vars = [v for layer in local_layers for v in layer.trainable_weights]
    return DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
        _local_vars=local_vars,
    )
