"""Point-to-point send and receive of torch tensors (the policy lives in
hvdlite/common/p2p.py; this binds it to TORCH). ``dst`` / ``src`` are ranks of the
process set. CUDA tensors travel through a host copy (the core's point-to-point runs
on host memory): a send copies before it posts, a receive copies back when it is
synchronized."""

import torch

from hvdlite.common import collectives, ops, p2p
from hvdlite.common.p2p import P2POp
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch.buffers import TORCH

__all__ = ["P2POp", "batch_isend_irecv", "recv", "recv_async", "send", "send_async"]


def _post(kind, tensor, peer, tag, process_set, name):
    if not TORCH.stage_on_host(tensor):
        return p2p.post(TORCH, kind, tensor, peer, tag, process_set, name)
    host = tensor.detach().cpu() if kind == p2p.SEND else torch.empty_like(tensor, device="cpu")
    pending = p2p.post(TORCH, kind, host, peer, tag, process_set, name)

    def finish():
        pending.finish()
        if kind == p2p.SEND:
            return None
        with torch.no_grad():
            tensor.copy_(host)
        return tensor

    return collectives.Pending(pending.core, finish, (tensor, pending.keepalive))


def send_async(tensor, dst, tag=0, process_set=global_process_set, name=None):
    """Posts a send of `tensor` to rank `dst` of `process_set`, matched by `tag`; returns a
    handle whose synchronize() returns None once `tensor` may be reused. The sender never
    waits for the receiver to post its recv."""
    return collectives.start(_post(p2p.SEND, tensor, dst, tag, process_set, name))


def recv_async(tensor, src, tag=0, process_set=global_process_set, name=None):
    """Posts a receive into `tensor` from rank `src` of `process_set` with `tag`;
    synchronize() returns `tensor`, which then holds the message (same shape and dtype)."""
    return collectives.start(_post(p2p.RECV, tensor, src, tag, process_set, name))


def send(tensor, dst, tag=0, process_set=global_process_set, name=None):
    """Sends `tensor` to rank `dst` of `process_set`; returns once `tensor` may be reused."""
    ops.synchronize(send_async(tensor, dst, tag, process_set, name))


def recv(tensor, src, tag=0, process_set=global_process_set, name=None):
    """Receives from rank `src` of `process_set` with `tag` into `tensor`; returns it."""
    return ops.synchronize(recv_async(tensor, src, tag, process_set, name))


def batch_isend_irecv(p2p_ops):
    """Posts every P2POp at once (as torch.distributed.batch_isend_irecv); returns one
    handle per op, in order, for synchronize()."""
    return p2p.start_group(p2p_ops, _post)
