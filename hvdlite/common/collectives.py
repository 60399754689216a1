"""Framework-neutral submission of collectives on framework tensors.

Each adapter (NumPy, PyTorch, TensorFlow) describes its tensor type once with a
``BufferAdapter``; the functions here turn a call into core operations and
return ``Pending`` records (core handle, ``finish`` callable, buffers to keep
alive). ``start`` / ``start_group`` register them as the integer handles users
pass to ``poll`` / ``synchronize`` (one handle for a whole group, as Horovod's
grouped ops return). Blocking in-place calls (allreduce_, broadcast_) skip the handle:
``inplace_sync`` submits and waits in one call into the core (ops.run).

Buffers reach the core by pointer: a tensor that is already contiguous in host
memory is used as it is; any other goes through a contiguous copy (written back
after in-place operations). A NumPy array is handed to the core as the array
itself, whatever the adapter: the core reads its address through the buffer
protocol, which costs far less than array.ctypes.data (microseconds per call,
most of a small operation's Python time). The tensors stay referenced until the
handle is synchronized.
"""

import abc
import collections

import numpy as np

from hvdlite.common import dtypes, exceptions, naming, ops
from hvdlite.common.process_sets import resolve

# names: the (core process set id, wire name) of its operation, held until synchronize()
# (ops.register); () for operations matched by something else (point-to-point: peer and tag).
# A Pending derived from another (a finish() wrapped around it) keeps its names: _replace.
Pending = collections.namedtuple("Pending", "core finish keepalive names", defaults=((),))


class BufferAdapter(abc.ABC):
    """What the shared code needs to know about one framework's tensors.
    Subclasses implement every abstract method."""

    # Given names become '<kind>.<name>' on the wire (naming.auto_name), as Horovod's PyTorch does.
    qualified_names = False

    @abc.abstractmethod
    def dtype_code(self, tensor):
        """The core dtype code (hvdlite.common.dtypes) of `tensor`, or None."""

    def check_device(self, tensor, name):  # noqa: B027 (optional hook; host memory is always reachable)
        """Raises NotSupportedError for tensors the core cannot reach (memory of
        a device it has no backend for)."""

    def host_direct(self, tensor):
        """(data, dtype code) of a host tensor the core may use as it is (contiguous, writable,
        a supported dtype), which needs no device_kwargs; `data` is what ops.run takes. None
        for anything else: the caller then takes the general path (check_device, is_direct,
        describe). Runs once per in-place operation (inplace, inplace_sync), so it must be cheap."""
        return None

    @abc.abstractmethod
    def is_direct(self, tensor):
        """True when the core may read and write `tensor`'s memory as it is
        (contiguous, writable, host memory)."""

    @abc.abstractmethod
    def contiguous_copy(self, tensor):
        """A new contiguous tensor with `tensor`'s values (never an alias)."""

    @abc.abstractmethod
    def pointer(self, tensor):
        """The address of a direct tensor's first element."""

    def device_kwargs(self, tensor):
        """Where the buffer lives, as ops.submit's device= / stream= (host memory: {})."""
        return {}

    @abc.abstractmethod
    def shape(self, tensor):
        """The tensor's shape as a sequence of ints."""

    @abc.abstractmethod
    def copy_into(self, dst, src):
        """dst[...] = src, for same-shape tensors, outside any autograd record."""

    @abc.abstractmethod
    def from_core(self, data, shape, like):
        """Wraps the core's output (a uint8 NumPy array, or None when empty) as a
        tensor of `like`'s dtype with `shape`, without a copy."""

    @abc.abstractmethod
    def assign_float64(self, dst, values):
        """dst[...] = values (a float64 NumPy array of dst's shape), rounded to dst's dtype."""


def describe(adapter, tensor, name):
    """(data, dtype code, shape) of a direct tensor; raises for unsupported dtypes. `data` is
    what ops.submit takes: a NumPy array itself (direct, hence C-contiguous, as the core's
    buffer-protocol read requires), else adapter.pointer(tensor)."""
    code = adapter.dtype_code(tensor)
    if code is None:
        raise exceptions.NotSupportedError(
            "tensor '%s' has dtype %s, which hvdlite does not support; use one of %s"
            % (name, getattr(tensor, "dtype", type(tensor)), ", ".join(sorted(dtypes.CODE_BY_NAME)))
        )
    data = tensor if isinstance(tensor, np.ndarray) else adapter.pointer(tensor)
    return data, code, tuple(adapter.shape(tensor))


def _direct(adapter, tensor, name):
    adapter.check_device(tensor, name)
    return tensor if adapter.is_direct(tensor) else adapter.contiguous_copy(tensor)


def inplace(adapter, kind, op_type, tensor, name, **submit_kw):
    """An in-place operation (allreduce, broadcast) on `tensor`; finish() returns `tensor`."""
    name = naming.auto_name(kind, name, adapter.qualified_names)
    direct = adapter.host_direct(tensor)
    if direct is not None:  # a host tensor the core uses as it is: skip the general checks
        work = tensor
        data, code = direct
        core = ops.submit(op_type, name, data, code, tensor.shape, **submit_kw)
    else:
        work = _direct(adapter, tensor, name)
        data, code, shape = describe(adapter, work, name)
        core = ops.submit(op_type, name, data, code, shape, **submit_kw, **adapter.device_kwargs(work))

    def finish():
        ops.release(core)
        if work is not tensor:
            adapter.copy_into(tensor, work)
        return tensor

    return Pending(core, finish, (tensor, work), ((submit_kw.get("process_set", 0), name),))


def inplace_sync(
    adapter, kind, op_type, tensor, name, reduce_op=0, prescale=1.0, postscale=1.0, root=0, process_set=0
):
    """What synchronize(start(inplace(...))) returns, with one call into the core and no
    user handle (ops.run): the blocking in-place calls (allreduce_, broadcast_).
    `process_set` is a core id (process_sets.resolve)."""
    name = naming.auto_name(kind, name, adapter.qualified_names)
    direct = adapter.host_direct(tensor)
    if direct is not None:  # a host tensor the core uses as it is: skip the general checks
        data, code = direct
        ops.run(op_type, name, data, code, tensor.shape, reduce_op, prescale, postscale, root, process_set)
        return tensor
    work = _direct(adapter, tensor, name)
    data, code, shape = describe(adapter, work, name)
    device = adapter.device_kwargs(work)
    ops.run(op_type, name, data, code, shape, reduce_op, prescale, postscale, root, process_set, **device)
    if work is not tensor:
        adapter.copy_into(tensor, work)
    return tensor


def allreduce_sync(adapter, tensor, name, reduce_op, prescale, postscale, process_set):
    """allreduce_ (not Adasum, whose steps each adapter runs itself) through inplace_sync."""
    return inplace_sync(
        adapter,
        "allreduce",
        ops.ALLREDUCE,
        tensor,
        name,
        reduce_op,
        prescale,
        postscale,
        0,
        resolve(process_set),
    )


def with_output(adapter, kind, op_type, tensor, name, shape=None, out=None, **submit_kw):
    """An operation whose output the core allocates (allgather, alltoall,
    reducescatter); finish() returns (output tensor, received splits list).
    `shape` overrides the shape the core sees (same element count). `out`: a direct host
    tensor of the input's dtype that the core writes the result into instead (no copy; it
    must hold the whole result, else the operation fails naming both sizes); finish() then
    returns (out, splits)."""
    name = naming.auto_name(kind, name, adapter.qualified_names)
    work = _direct(adapter, tensor, name)
    data, code, own_shape = describe(adapter, work, name)
    if out is not None:
        return _into(
            adapter, op_type, name, work, data, code, own_shape if shape is None else shape, out, submit_kw
        )
    core = ops.submit(
        op_type,
        name,
        data,
        code,
        own_shape if shape is None else shape,
        **submit_kw,
        **adapter.device_kwargs(work),
    )

    def finish():
        data, out_shape, splits, _ = ops.take_output(core)
        return adapter.from_core(data, out_shape, work), splits

    return Pending(core, finish, work, ((submit_kw.get("process_set", 0), name),))


def _into(adapter, op_type, name, work, data, code, shape, out, submit_kw):
    count = 1
    for d in adapter.shape(out):
        count *= int(d)
    output = (adapter.pointer(out), count * dtypes.ITEM_BYTES[code])
    core = ops.submit(op_type, name, data, code, shape, output=output, **submit_kw)

    def finish():
        splits = ops.take_output(core)[2]
        return out, splits

    return Pending(core, finish, (work, out), ((submit_kw.get("process_set", 0), name),))


def group_names(kind, name, count):
    """Names of the members of a grouped operation: '<name>.<i>' (each member's own call then
    qualifies it where the adapter does: 'allreduce.<name>.<i>')."""
    base = naming.auto_name("grouped_" + kind, name)
    return ["%s.%d" % (base, i) for i in range(count)]


def start(pending, then=None):
    """Registers one Pending; synchronize() returns then(finish()) (or finish())."""
    finish = pending.finish if then is None else lambda: then(pending.finish())
    return ops.register(pending.core, finish, pending.keepalive, pending.names)


def start_group(pendings, then=None):
    """Registers several Pendings as one handle; synchronize() returns the list
    of their results (each passed through `then` when given)."""
    pendings = list(pendings)
    then = then or (lambda x: x)
    return ops.register(
        tuple(p.core for p in pendings),
        lambda: [then(p.finish()) for p in pendings],
        tuple(p.keepalive for p in pendings),
        tuple(key for p in pendings for key in p.names),
    )


def barrier(process_set):
    """Returns once every member of `process_set` has called barrier()."""
    core = ops.submit(
        ops.BARRIER,
        naming.auto_name("barrier", None),
        0,
        dtypes.UINT8,
        (0,),
        process_set=resolve(process_set),
    )
    ops.wait(core)
    ops.release(core)
