"""Point-to-point send and receive on framework tensors, shared by every adapter.

``send(tensor, dst, tag, process_set)`` and ``recv(tensor, src, tag, process_set)``
move one tensor between two members of a process set (``dst`` / ``src`` are ranks of
the set), matched by (process set, source, tag), with no coordinator and no other
rank involved (the core's csrc/runtime/p2p.h). Both are asynchronous underneath:
``post`` returns a ``Pending`` whose handle completes, for a send, once the tensor
may be reused (the receiver need not have posted its recv: a sender never waits for
the receiver), and for a recv once the tensor holds the message. A grouped call
(``post_group``, the adapters' ``batch_isend_irecv``) posts several at once.

CUDA tensors (torch) go through the core's NCCL module where it is installed; a CUDA
send waits for its recv.

Errors name the tensor, both ranks and the tag: a rank outside the set, a size
mismatch between the two sides (or a CUDA tensor on one side and a host one on the other), a recv unmatched after HVDLITE_TIMEOUT_SECONDS, a
sender that died or shut down.
"""

from hvdlite.common import buffer, collectives, exceptions, naming, ops
from hvdlite.common.native import core as _core
from hvdlite.common.process_sets import global_process_set, resolve

SEND, RECV = 0, 1  # hvdlite_p2p's kinds (csrc/include/hvdlite/c_api.h)
_KIND_NAMES = {SEND: "send", RECV: "recv"}


def _kind_of(op):
    """SEND or RECV for P2POp's `op`: 'send' / 'recv', or an adapter's function
    (send, send_async, isend, recv, ...), as torch.distributed.P2POp takes isend / irecv."""
    label = op if isinstance(op, str) else getattr(op, "__name__", "")
    label = label.lower()
    if label in ("send", "isend", "send_async"):
        return SEND
    if label in ("recv", "irecv", "recv_async"):
        return RECV
    raise exceptions.InvalidArgumentError(
        "P2POp's op must be 'send' or 'recv' (or hvd.send / hvd.recv and their async forms), got %r" % (op,)
    )


class P2POp:
    """One send or receive of a grouped call (``batch_isend_irecv``), as
    torch.distributed.P2POp: ``P2POp(hvd.send, tensor, peer, tag=0, process_set=...)``."""

    __slots__ = ("kind", "name", "peer", "process_set", "tag", "tensor")

    def __init__(self, op, tensor, peer, tag=0, process_set=global_process_set, name=None):
        self.kind = _kind_of(op)
        self.tensor = tensor
        self.peer = peer
        self.tag = tag
        self.process_set = process_set
        self.name = name


def _rank_arg(value, what, name):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise exceptions.InvalidArgumentError(
            "%s of tensor '%s' must be an int rank, got %r" % (what, name, value)
        )
    return value.__index__()


def post(adapter, kind, tensor, peer, tag=0, process_set=global_process_set, name=None):
    """Posts one send (kind SEND) or receive (RECV) of `tensor`; returns a Pending whose
    finish() returns None for a send and `tensor` (now holding the message) for a recv."""
    label = _KIND_NAMES[kind]
    name = naming.auto_name(label, name, adapter.qualified_names)
    peer = _rank_arg(peer, "dst" if kind == SEND else "src", name)
    tag = _rank_arg(tag, "tag", name)
    # CUDA tensors go through the core's NCCL module: the adapter has synchronized the
    # tensor's stream, so the data is ready (hvdlite_p2p's contract).
    data, code, shape, device, _, _, work, assign, _ = adapter.describe(tensor, name)
    status, message, handle = _core.p2p(
        kind, name, buffer.address(data), buffer.nbytes(code, shape), peer, tag, resolve(process_set), device
    )
    exceptions.raise_for_status(status, message)

    def finish():
        ops.release(handle)
        if kind == SEND:
            return None
        if work is not tensor:
            assign(tensor, work)
        return tensor

    return collectives.Pending(handle, finish, (tensor, work))


def post_bytes(kind, array, peer, tag, process_set_id, name):
    """The lean post() for a caller that owns its buffers and has checked its peers and tags
    once (the pipeline's stage-to-stage transfer): `array` is a C-contiguous uint8 NumPy array
    in host memory, `process_set_id` a core id (process_sets.resolve). Returns the core
    handle: the caller waits for it (ops.wait) and then releases it (ops.release). Errors the
    core finds (a peer outside the set, a broken job) raise as post()'s do."""
    status, message, handle = _core.p2p(
        kind, name, array.__array_interface__["data"][0], array.nbytes, peer, tag, process_set_id, -1
    )
    exceptions.raise_for_status(status, message)
    return handle


def start(adapter, kind, tensor, peer, tag, process_set, name):
    """post() registered as a user handle for synchronize()."""
    return collectives.start(post(adapter, kind, tensor, peer, tag, process_set, name))


def run(adapter, kind, tensor, peer, tag, process_set, name):
    """post() and wait: a blocking send (returns None) or recv (returns `tensor`)."""
    pending = post(adapter, kind, tensor, peer, tag, process_set, name)
    ops.wait(pending.core)  # releases the handle on error
    return pending.finish()


def start_group(p2p_ops, post_op):
    """Posts every P2POp of `p2p_ops` at once through `post_op(kind, tensor, peer, tag,
    process_set, name)` (post() with an adapter bound, or an adapter's own staging post);
    returns one handle per op, in order (synchronize each, as torch's batch_isend_irecv
    returns one request per op). The list is checked before anything is posted, and every
    op is posted before any is waited for, so the order of sends and receives in the list
    cannot deadlock."""
    for op in p2p_ops:
        if not isinstance(op, P2POp):
            raise exceptions.InvalidArgumentError("batch_isend_irecv takes a list of P2POp, got %r" % (op,))
    return [
        collectives.start(post_op(op.kind, op.tensor, op.peer, op.tag, op.process_set, op.name))
        for op in p2p_ops
    ]
