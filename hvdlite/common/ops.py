"""Submitting operations to the core and waiting for them; shared by every
framework adapter. Adapters turn their tensors into (pointer, dtype code,
shape) and keep them alive until the operation completes; this module owns
the integer handles users see (Horovod's async API) and the waiting policy.
"""

import ctypes
import threading
import time

from hvdlite.common import exceptions
from hvdlite.common.native import core as _core

# The core's OpType codes (csrc/coordinator/messages.h; tests/test_enums_match_core.py checks them).
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER = range(6)
JOIN = 9

# How long one wait slice lasts: Python regains control this often, so Ctrl-C
# works during a long collective. The core bounds the overall wait itself
# (transport timeout, stall shutdown time).
_WAIT_SLICE_S = 0.5


def submit(
    op_type,
    name,
    ptr,
    dtype,
    shape,
    reduce_op=0,
    prescale=1.0,
    postscale=1.0,
    root=0,
    splits=(),
    process_set=0,
    device=-1,
    stream=0,
    output=None,
):
    """Hands one operation to the core; returns its core handle. Raises at once
    if the core refuses it (not initialized, name in flight, broken job). `ptr` is
    the data's address, or a C-contiguous object with the buffer protocol.
    CUDA tensors: `device` is the tensor's CUDA device, `stream` the framework's
    current cudaStream_t as an int (see hvdlite_op in csrc/include/hvdlite/c_api.h).
    `output`: (address or buffer-protocol object, bytes) of host memory where an allgather,
    alltoall or reducescatter writes its result (kept alive by the caller until the operation
    completes; take_output then returns no data), or None: the core allocates the output."""
    if _held_names:  # the call only while some handle holds a name (this runs per operation)
        _check_name_free(process_set, name)
    # The core converts the numbers and the shape itself (as for run()): this runs per tensor.
    args = (
        op_type,
        name,
        ptr,
        dtype,
        shape,
        reduce_op,
        prescale,
        postscale,
        root,
        [int(s) for s in splits] if len(splits) else [],  # a splits tensor iterates as 0-d tensors
        process_set,
        device,
        stream,
    )
    if output is None:
        code, message, handle = _core.enqueue(*args)
    else:
        code, message, handle = _core.enqueue(*args, output[0], output[1])
    exceptions.raise_for_status(code, message)
    return handle


def run(
    op_type,
    name,
    ptr,
    dtype,
    shape,
    reduce_op=0,
    prescale=1.0,
    postscale=1.0,
    root=0,
    process_set=0,
    device=-1,
    stream=0,
):
    """submit() + wait() + release() for an operation whose caller blocks until it is
    done and has no output to take (in-place allreduce/broadcast): one call into the
    core, which releases the GIL once, and no user handle. Raises what submit() or
    wait() would raise. Blocks until done; Python regains control every wait slice.
    The core converts the numbers (Python ints and floats, or anything with __index__ /
    __float__), as submit() does with int() and float(); this runs per operation."""
    if _held_names:  # the call only while some handle holds a name (this runs per operation)
        _check_name_free(process_set, name)
    pending = _core.submit_wait(
        op_type,
        name,
        ptr,
        dtype,
        shape,
        reduce_op,
        prescale,
        postscale,
        root,
        [],
        process_set,
        device,
        stream,
        _WAIT_SLICE_S,
    )
    if pending is None:  # over, and it succeeded
        return
    code, message, handle, token = pending
    if handle == 0:  # over with an error: the core released the handle and ended the wait
        exceptions.raise_for_status(code, message)
        return
    try:
        _wait_one(handle)  # releases the handle on error
    finally:
        _core.wait_end(token)
    _core.release(handle)


def wait(core_handle, deadline=None):
    """Blocks until the operation completes; raises its error, if any. With `deadline` (a
    time.monotonic() value): returns False, the operation still running and its handle live,
    when the deadline passes first; True once it completed."""
    token = _core.wait_begin([core_handle])
    try:
        return _wait_one(core_handle, deadline)
    finally:
        _core.wait_end(token)


def _wait_one(core_handle, deadline=None):
    while True:
        slice_s = _WAIT_SLICE_S
        if deadline is not None:
            slice_s = min(slice_s, deadline - time.monotonic())
            if slice_s <= 0:
                if _core.poll(core_handle) == 0:
                    return False
                slice_s = 0.0
        code, message = _core.wait(core_handle, slice_s)
        if code == exceptions.TIMEOUT:  # the slice ended, or the operation itself timed out
            state = _core.poll(core_handle)
            if state == 0:  # still running: wait another slice
                continue
            if state == 1:
                # Done, perhaps just after the slice ended (e.g. failed by a dead peer): its own
                # status, at once, not the slice's "still in progress".
                code, message = _core.wait(core_handle, 0.0)
        if code != exceptions.OK:
            _core.release(core_handle)
        exceptions.raise_for_status(code, message)
        return True


def take_output(core_handle):
    """(uint8 array owning the core's output, shape, received_splits, value)."""
    code, message, data, shape, splits, value = _core.take_output(core_handle)
    exceptions.raise_for_status(code, message)
    return data, shape, splits, value


def release(core_handle):
    _core.release(core_handle)


def join():
    """Horovod's join(): this rank has no more data. Until every rank has
    joined, it takes part in the allreduce and barrier calls the others still
    make, contributing the reduction's identity (zeros for Sum/Average); as in
    Horovod, allgather, broadcast, alltoall and reducescatter fail
    (NotSupportedError) while a rank is joined. Returns the rank that joined
    last, on every rank."""
    core = submit(JOIN, "__join__", 0, 0, (0,))
    wait(core)
    return take_output(core)[3]


class _Pending:
    __slots__ = ("core_handle", "finish", "keepalive", "names")

    def __init__(self, core_handle, finish, keepalive, names):
        self.core_handle = core_handle
        self.finish = finish
        self.keepalive = keepalive
        self.names = names


_pending: dict[int, _Pending] = {}
_pending_lock = threading.Lock()
_next_handle = [0]
# User handles registered before the latest init(): their core handles belonged to a runtime
# that is gone, and the new runtime reuses those numbers, so they must never reach the core.
_stale: set[int] = set()
# Names held by user handles not synchronized yet: (core process set id, wire name) -> user
# handle. The core frees a name when its operation completes, which may be before the caller
# has even returned from *_async; holding it here until synchronize() makes a second submission
# of the name fail every time, not only when the first happens to still be running.
_held_names: dict[tuple[int, str], int] = {}


def _check_name_free(process_set, name):
    """Raises PreconditionError (the core's own error for a name in flight) when a user handle
    not yet synchronized holds `name` in `process_set`. Runs per submission: one dict lookup."""
    if _held_names and (process_set, name) in _held_names:
        raise exceptions.PreconditionError(
            "a tensor named '%s' is already in flight (handle %d is not synchronized); wait for "
            "it (synchronize) or give each concurrent operation a unique name"
            % (name, _held_names[(process_set, name)])
        )


def start_session():
    """Called by init() once a new runtime is up. Every handle still registered belongs to
    the ended session: it is forgotten (its buffers released), and poll()/synchronize() on it
    raise InvalidArgumentError instead of touching the new runtime's operations. User handle
    numbers keep increasing across sessions, so they never collide."""
    with _pending_lock:
        _stale.update(_pending)
        _pending.clear()
        _held_names.clear()


def register(core_handle, finish, keepalive=None, names=()):
    """Makes a user-visible handle. `finish()` runs once the operation is done
    and returns what synchronize() returns; `keepalive` holds the buffers the
    core is using until then. `core_handle` may be a tuple of core handles (a
    grouped operation): the handle is done when all of them are. `names`, the
    (core process set id, wire name) pairs of its operations, stay in flight
    (submit() refuses them) until synchronize()."""
    with _pending_lock:
        _next_handle[0] += 1
        handle = _next_handle[0]
        _pending[handle] = _Pending(core_handle, finish, keepalive, names)
        for key in names:
            _held_names[key] = handle
    return handle


def _unregister(handle):
    with _pending_lock:
        entry = _pending.pop(handle, None)
        for key in entry.names if entry is not None else ():
            if _held_names.get(key) == handle:
                del _held_names[key]


def _lookup(handle):
    with _pending_lock:
        entry = _pending.get(handle)
        stale = handle in _stale
    if stale:
        raise exceptions.InvalidArgumentError(
            "handle %r was started before hvd.shutdown() and its job has ended: its result is "
            "lost; synchronize handles before shutdown(), or start the operation again" % (handle,)
        )
    if entry is None:
        raise exceptions.InvalidArgumentError("unknown or already synchronized handle %r" % (handle,))
    return entry


def poll_core(core_handle):
    """True when the operation behind a core handle (not a user handle) has completed or is
    unknown; never blocks."""
    return _core.poll(core_handle) != 0


def poll(handle):
    """True when the operation behind `handle` has completed (Horovod's poll)."""
    return all(poll_core(h) for h in _core_handles(_lookup(handle)))


def core_handles(handle):
    """The core handles behind a user handle (one, or several for a grouped operation),
    for native code that waits on them (e.g. the TensorFlow await kernel) before
    synchronize() takes the result."""
    return list(_core_handles(_lookup(handle)))


def native_entry_points(*names):
    """Addresses of the core's C functions `names` (csrc/include/hvdlite/c_api.h), for
    native code that calls the core directly (the TensorFlow kernels)."""
    lib = ctypes.CDLL(_core.__file__)  # the module already loaded: the same library
    return tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names)


def native_wait_entry_points():
    """Addresses of hvdlite_wait and hvdlite_poll, for native code that waits on core handles."""
    return native_entry_points("hvdlite_wait", "hvdlite_poll")


def _core_handles(entry):
    return entry.core_handle if isinstance(entry.core_handle, tuple) else (entry.core_handle,)


def _wait_all(core_handles):
    """Waits for every core handle, even after one failed (the core may still be
    using the buffers of the others); then raises the first error. While it
    blocks, the core's deadlock detector knows this rank waits for all of them."""
    if len(core_handles) == 1 and _core.poll(core_handles[0]) == 1:
        _wait_one(core_handles[0])  # done already: nothing to tell the deadlock detector
        return
    first_error = None
    token = _core.wait_begin(list(core_handles))
    try:
        for core_handle in core_handles:
            try:
                _wait_one(core_handle)
            except exceptions.HvdliteError as e:
                first_error = first_error or e
    finally:
        _core.wait_end(token)
    if first_error is not None:
        for core_handle in core_handles:  # all done now: free what the others produced
            _core.release(core_handle)
        raise first_error


def synchronize(handle):
    """Waits for `handle` and returns the operation's result."""
    entry = _lookup(handle)
    try:
        _wait_all(_core_handles(entry))
        return entry.finish()
    finally:
        _unregister(handle)
