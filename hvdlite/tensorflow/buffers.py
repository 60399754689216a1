"""Moving values between TensorFlow tensors and the NumPy path of the core.

Contracts:
  - ``to_numpy(t)``: a NumPy view (eager CPU tensors: no copy) that callers
    only READ; every collective writes into a fresh array or a core-owned one.
  - ``to_tensor(a)``: a tf.Tensor with `a`'s values. Zero-copy through DLPack
    when `a` is C-contiguous, non-empty and its data is 64-byte aligned;
    otherwise a copy. TensorFlow (seen with tensorflow-cpu 2.21) aborts the
    whole process on a DLPack buffer that is not 64-byte aligned, so the
    check is mandatory, never an optimisation to drop.
  - ``call_numpy(fn, inputs, dtypes, shapes)``: runs fn(*numpy arrays) ->
    list of arrays. Eagerly it calls fn directly; while tracing a tf.function
    it inserts a tf.numpy_function (stateful, so TensorFlow's automatic control
    dependencies keep collectives in program order on every rank) and sets
    the static output shapes.
  - ``call_collective(start, finish, ...)``: a collective that, in a graph,
    never blocks one of TensorFlow's executor threads while it waits (see there).
  - ``call_each(start_one, finish, ...)``: the same for a list of tensors, where in a graph
    each tensor's submission waits for that tensor only (see there).
"""

import numpy as np
import tensorflow as tf

from hvdlite.common import exceptions, ops
from hvdlite.common.buffer_pool import ALIGNMENT as _ALIGNMENT
from hvdlite.common.buffer_pool import AlignedPool
from hvdlite.tensorflow import await_op, errors

# Buffers of in-place collectives (allreduce, broadcast), reused across steps.
_POOL = AlignedPool(_ALIGNMENT)

# TensorFlow dtypes the core carries (hvdlite.common.dtypes).
SUPPORTED = (
    tf.uint8,
    tf.int8,
    tf.uint16,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.bool,
)


def is_aligned(array):
    return array.ctypes.data % _ALIGNMENT == 0


def aligned_copy(array):
    """A C-contiguous, writable copy of `array` whose data is 64-byte aligned, so that
    TensorFlow can adopt it as a tensor without another copy (numpy_function outputs,
    to_tensor). The copy is what an in-place collective works on: the input array views a
    TensorFlow tensor that other ops may still read, so it is never written, whatever its
    alignment (the core itself needs only element alignment). Its memory comes from a pool
    reused once TensorFlow has released the tensor that adopted it (hvdlite.common.buffer_pool),
    which spares the page faults of fresh memory every step."""
    return _POOL.copy(array)


def to_numpy(tensor):
    if isinstance(tensor, np.ndarray):
        return tensor
    return tensor.numpy()


def to_tensor(array):
    """A tf.Tensor holding `array` (shared when DLPack is safe, see module doc)."""
    array = np.asarray(array)
    if (
        array.size
        and array.flags.c_contiguous
        and array.flags.writeable
        and is_aligned(array)
        and array.dtype != np.bool_
    ):
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except Exception:  # a dtype DLPack does not carry (bfloat16 on old NumPy): copy instead
            pass
    return tf.convert_to_tensor(array)


def check_dtype(tensor, what):
    """Raises NotSupportedError for a dtype the core does not carry, naming the tensor."""
    if tensor.dtype not in SUPPORTED:
        raise exceptions.NotSupportedError(
            "%s: tensor has dtype %s, which hvdlite does not support; use one of %s"
            % (what, tensor.dtype.name, ", ".join(d.name for d in SUPPORTED))
        )


def call_numpy(fn, inputs, dtypes, shapes, name="hvdlite"):
    """fn(*arrays) -> list of arrays, as tensors of `dtypes` with static `shapes`
    (a TensorShape / list per output; None dimensions where only the job knows)."""
    if tf.executing_eagerly():
        try:
            outs = fn(*[to_numpy(t) for t in inputs])
        except exceptions.HvdliteError as e:
            raise errors.tf_error(e) from None
        return [to_tensor(np.asarray(o, dtype=d.as_numpy_dtype)) for o, d in zip(outs, dtypes)]

    def graph_fn(*arrays):
        return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(fn(*arrays), dtypes)]

    outs = tf.numpy_function(graph_fn, list(inputs), list(dtypes), stateful=True, name=name)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return list(outs)


def call_collective(start, finish, inputs, dtypes, shapes, name="hvdlite"):
    """A collective whose completion does not depend on the order in which TensorFlow's
    executor runs a graph's ops. start(*arrays) submits and returns hvdlite handles at
    once; finish(handles) synchronizes them and returns the output arrays.

    Eagerly: finish(start(...)), hvdlite's errors as errors.tf_error gives them. In a
    graph (tf.function or tf.compat.v1), three ops:
    a stateful numpy_function that submits (automatic control dependencies keep
    submissions in program order), the HvdliteAwait kernel, which waits on a thread of
    its own, and a stateless numpy_function that takes the result (stateless, so that
    control dependencies never hold the next submission until this collective is done).
    So no executor thread blocks while a collective waits, and any number of
    independent collectives completes whatever order each rank runs them in. Without
    the kernel (await_op.load() is None): one blocking numpy_function (call_numpy)."""
    module = None if tf.executing_eagerly() else await_op.load()
    if module is None:
        return call_numpy(lambda *arrays: finish(start(*arrays)), inputs, dtypes, shapes, name)

    def submit(*arrays):
        handles = start(*arrays)
        core = [c for h in handles for c in ops.core_handles(h)]
        return np.asarray(handles, dtype=np.int64), np.asarray(core, dtype=np.int64)

    def take(handles):
        outs = finish([int(h) for h in handles])
        return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(outs, dtypes)]

    user, core = tf.numpy_function(
        submit, list(inputs), [tf.int64, tf.int64], stateful=True, name=name + "Submit"
    )
    ready = module.hvdlite_await(core, user, name=name + "Await")
    outs = tf.numpy_function(take, [ready], list(dtypes), stateful=False, name=name)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return list(outs)


def call_each(start_one, finish, inputs, names, name="hvdlite"):
    """Like call_collective for collectives whose outputs have their inputs' dtypes and
    shapes, one per input: start_one(array, name, owned) submits one and returns its handle;
    `owned` says the array's memory is the collective's alone, so it may write into it
    (otherwise it works on a copy: the array views a tensor other ops may read).

    In a graph with the HvdliteAwait kernel, every input gets its own submission, await and
    result, so a submission depends on its own input only and the executor runs it as soon as
    that tensor exists: the allreduce of one gradient runs while the backward pass computes
    the next. Submissions stay in program order (stateful ops; see call_collective), so a
    caller that wants them to start early creates them in the order their inputs are computed.
    Each input first goes through HvdliteExclusive (await_op.exclusive), which hands over the
    tensor's own buffer when nothing else uses it: then `owned` is True and no copy is made.
    Eagerly or without the kernel: one call_collective that submits all before waiting."""
    dtypes = [t.dtype for t in inputs]
    shapes = [t.shape for t in inputs]
    if tf.executing_eagerly() or await_op.load() is None:

        def start_all(*arrays):
            return [start_one(a, n, False) for a, n in zip(arrays, names)]

        return call_collective(start_all, finish, inputs, dtypes, shapes, name)
    outs = []
    for t, n in zip(inputs, names):
        owned = await_op.exclusive(t)
        source = t if owned is None else owned

        def start(array, n=n, owned=owned is not None):
            return [start_one(array, n, owned)]

        outs += call_collective(start, finish, [source], [t.dtype], [t.shape], name)
    return outs


def writable(array, owned):
    """`array` itself when an in-place collective may work on it (owned, see call_each, and
    laid out as the core and TensorFlow's zero-copy adoption of the result need), else
    aligned_copy(array)."""
    if owned and array.flags.writeable and array.flags.carray and is_aligned(array):
        return array
    return aligned_copy(array)
