"""hvdlite's errors as TensorFlow raises Horovod's: a collective that fails because
ranks disagree (shape, dtype, root rank: MismatchError, PreconditionError) is also a
``tf.errors.FailedPreconditionError``, one given a bad argument (InvalidArgumentError)
also a ``tf.errors.InvalidArgumentError``, as Horovod's TensorFlow kernels report them.

``tf_error(e)`` returns an exception of a class derived from both e's class and the
TensorFlow error class (so ``except hvd.MismatchError`` and ``except
tf.errors.FailedPreconditionError`` both catch it), or e itself for other errors.
Eagerly, collectives raise these (buffers.call_collective); in a graph, the await
kernel (await_op.cc) fails with the matching TensorFlow status.
"""

import tensorflow as tf

from hvdlite.common import exceptions

# hvdlite class -> TensorFlow class; the most derived hvdlite class first.
_TF_CLASS = (
    (exceptions.MismatchError, tf.errors.FailedPreconditionError),
    (exceptions.CallOrderError, None),
    (exceptions.PreconditionError, tf.errors.FailedPreconditionError),
    (exceptions.InvalidArgumentError, tf.errors.InvalidArgumentError),
)
_classes: dict[type, type] = {}


def _dual_class(cls, tf_cls):
    if cls not in _classes:
        _classes[cls] = type(cls.__name__, (cls, tf_cls), {"__module__": cls.__module__})
    return _classes[cls]


def tf_error(error):
    """`error` as the exception TensorFlow code catches (see module doc)."""
    for cls, tf_cls in _TF_CLASS:
        if isinstance(error, cls):
            if tf_cls is None or isinstance(error, tf_cls):
                return error
            dual = _dual_class(type(error), tf_cls)
            out = dual.__new__(dual)
            tf_cls.__init__(out, None, None, str(error))
            out.args = error.args
            out.__dict__.update({k: v for k, v in error.__dict__.items() if k not in out.__dict__})
            return out
    return error
