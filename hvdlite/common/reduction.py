"""Which reduction a call means, and how averaging is split into scale factors.

Shared by every adapter (NumPy, PyTorch, TensorFlow) so that ``op=``, the
deprecated ``average=`` and DistributedOptimizer's ``gradient_predivide_factor``
resolve the same way everywhere, as in Horovod.
"""

import warnings

from hvdlite.common import dtypes, exceptions


def resolve_op(op, average, default=dtypes.Average, reduce_ops=dtypes):
    """The ReduceOp for ``op=`` / the deprecated ``average=``, by Horovod's rule
    (handle_average_backwards_compatibility): both given is an InvalidArgumentError
    (a ValueError); ``average`` alone warns (DeprecationWarning) and means Average or
    Sum; neither means ``default``. ``reduce_ops``: where Average and Sum come from."""
    if op is not None:
        if average is not None:
            raise exceptions.InvalidArgumentError(
                "The op parameter supersedes average. Please provide only one of them."
            )
        return op
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return reduce_ops.Average if average else reduce_ops.Sum
    return default


def check_predivide(op, gradient_predivide_factor):
    """Horovod's rule: a gradient_predivide_factor other than 1 only makes
    sense when gradients are averaged."""
    if gradient_predivide_factor != 1.0 and op != dtypes.Average:
        raise exceptions.InvalidArgumentError("gradient_predivide_factor not supported with op != Average")


def gradient_scale_factors(op, gradient_predivide_factor):
    """(prescale, postscale) for a gradient allreduce. With op=Average the sum
    is taken of grad / f and then multiplied by f / size (the core applies the
    1/size of Average), which keeps large sums from overflowing in float16."""
    if op == dtypes.Average:
        return 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return 1.0, 1.0
