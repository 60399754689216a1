"""Framework-neutral submission of collectives on framework tensors.

Each adapter (NumPy, which TensorFlow uses too, and PyTorch) turns a tensor into a description
once, at its edge (``BufferAdapter.describe``, hvdlite/common/buffer.py): the data the core
reads (an address, or a NumPy array itself), dtype code, shape, device and stream, and how to
copy a work copy back or wrap a core output. The functions here work on that description
alone, asking the adapter nothing more: they turn a call into core operations and return
``Pending`` records (core handle, ``finish`` callable, buffers to keep alive). ``start`` / ``start_group`` register them as the integer
handles users pass to ``poll`` / ``synchronize`` (one handle for a whole group, as Horovod's
grouped ops return). Blocking in-place calls (allreduce_, broadcast_) skip the handle:
``inplace_sync`` submits and waits in one call into the core (ops.run).

A tensor whose memory the core can use as it is goes by its own memory; any other goes through
a contiguous copy (written back after in-place operations). The tensors stay referenced until
the handle is synchronized.
"""

import collections

from hvdlite.common import buffer, dtypes, exceptions, naming, ops
from hvdlite.common.process_sets import resolve

# names: the (core process set id, wire name) of its operation, held until synchronize()
# (ops.register); () for operations matched by something else (point-to-point: peer and tag).
# A Pending derived from another (a finish() wrapped around it) keeps its names: _replace.
Pending = collections.namedtuple("Pending", "core finish keepalive names", defaults=((),))


def inplace(adapter, kind, op_type, tensor, name, **submit_kw):
    """An in-place operation (allreduce, broadcast) on `tensor`; finish() returns `tensor`."""
    name = naming.auto_name(kind, name, adapter.qualified_names)
    data, code, shape, device, stream, _, work, assign, _ = adapter.describe(tensor, name)
    if device == -1:  # host memory: the submission's defaults (no keyword merge per call)
        core = ops.submit(op_type, name, data, code, shape, **submit_kw)
    else:
        core = ops.submit(op_type, name, data, code, shape, device=device, stream=stream, **submit_kw)

    def finish():
        ops.release(core)
        if work is not tensor:
            assign(tensor, work)
        return tensor

    return Pending(core, finish, (tensor, work), ((submit_kw.get("process_set", 0), name),))


def inplace_sync(
    adapter, kind, op_type, tensor, name, reduce_op=0, prescale=1.0, postscale=1.0, root=0, process_set=0
):
    """What synchronize(start(inplace(...))) returns, with one call into the core and no
    user handle (ops.run): the blocking in-place calls (allreduce_, broadcast_).
    `process_set` is a core id (process_sets.resolve)."""
    name = naming.auto_name(kind, name, adapter.qualified_names)
    data, code, shape, device, stream, _, work, assign, _ = adapter.describe(tensor, name)
    ops.run(
        op_type, name, data, code, shape, reduce_op, prescale, postscale, root, process_set, device, stream
    )
    if work is not tensor:
        assign(tensor, work)
    return tensor


def allreduce_sync(adapter, tensor, name, reduce_op, prescale, postscale, process_set):
    """allreduce_ (not Adasum, whose steps each adapter runs itself): inplace_sync's steps,
    written out (one Python call less on the most frequent blocking call)."""
    name = naming.auto_name("allreduce", name, adapter.qualified_names)
    data, code, shape, device, stream, _, work, assign, _ = adapter.describe(tensor, name)
    ops.run(
        ops.ALLREDUCE,
        name,
        data,
        code,
        shape,
        reduce_op,
        prescale,
        postscale,
        0,
        resolve(process_set),
        device,
        stream,
    )
    if work is not tensor:
        assign(tensor, work)
    return tensor


def with_output(adapter, kind, op_type, tensor, name, shape=None, out=None, **submit_kw):
    """An operation whose output the core allocates (allgather, alltoall,
    reducescatter); finish() returns (output tensor, received splits list).
    `shape` overrides the shape the core sees (same element count). `out`: a host tensor of the
    input's dtype that the core writes the result into instead (no copy when its memory is
    usable as it is, else through a contiguous copy written back; it must hold the whole
    result, else the operation fails naming both sizes); finish() then returns (out, splits)."""
    name = naming.auto_name(kind, name, adapter.qualified_names)
    buf = adapter.describe(tensor, name)
    dst = None if out is None else adapter.describe(out, name)
    return submit_output(op_type, name, buf, shape, dst, submit_kw)


def submit_output(op_type, name, buf, shape, dst, submit_kw):
    """with_output() on a description already made (adapter.describe): the core allocates the
    output, or writes it into the description `dst` (None: it allocates)."""
    data, code, own_shape, device, stream, _, work, _, wrap = buf
    shape = own_shape if shape is None else shape
    if dst is not None:
        return _into(op_type, name, buf, shape, dst, submit_kw)
    core = ops.submit(op_type, name, data, code, shape, device=device, stream=stream, **submit_kw)

    def finish():
        out_data, out_shape, splits, _ = ops.take_output(core)
        return wrap(out_data, out_shape, work), splits

    return Pending(core, finish, work, ((submit_kw.get("process_set", 0), name),))


def _where(code, device):
    return dtypes.NAMES[code] + (" on CUDA device %d" % device if device != -1 else "")


def _into(op_type, name, buf, shape, dst, submit_kw):
    data, code, _, device, _, _, work, _, _ = buf
    out_data, out_code, out_shape, out_device, _, out, out_work, assign, _ = dst
    if device != -1 or out_device != -1 or out_code != code:
        raise exceptions.InvalidArgumentError(
            "with an output tensor, '%s' takes host tensors of one dtype: got input %s, output %s; "
            "pass host tensors of the same dtype, or no output tensor"
            % (name, _where(code, device), _where(out_code, out_device))
        )
    output = (out_data, buffer.nbytes(out_code, out_shape))
    core = ops.submit(op_type, name, data, code, shape, output=output, **submit_kw)

    def finish():
        splits = ops.take_output(core)[2]
        if out_work is not out:
            assign(out, out_work)
        return out, splits

    return Pending(core, finish, (work, out, out_work), ((submit_kw.get("process_set", 0), name),))


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
