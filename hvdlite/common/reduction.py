"""Which reduction a call means, and how averaging is split into scale factors.

Shared by every adapter (NumPy, PyTorch, TensorFlow) so that ``op=``, the
deprecated ``average=`` and DistributedOptimizer's ``gradient_predivide_factor``
resolve the same way everywhere, as in Horovod.
"""

from hvdlite.common import dtypes, exceptions


def resolve_op(op, average, default=dtypes.Average):
    """The ReduceOp for ``op=`` / the deprecated ``average=`` (not both);
    ``default`` when neither is given."""
    if average is not None:
        if op is not None:
            raise exceptions.InvalidArgumentError("pass either op= or the deprecated average=, not both")
        return dtypes.Average if average else dtypes.Sum
    return default if op is None else op


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
