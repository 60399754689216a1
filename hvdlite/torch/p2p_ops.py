"""Point-to-point send and receive of torch tensors (the policy lives in
hvdlite/common/p2p.py; this binds it to TORCH). ``dst`` / ``src`` are ranks of the
process set. CUDA tensors go through NCCL send/recv (the core's NCCL module,
csrc/runtime/p2p_device.cc) where hvdlite was built with it: the tensor's current
stream is synchronized before the post (the module works on its own streams), and a
CUDA send waits for its recv. Without the module they travel through a host copy: a
send copies before it posts, a receive copies back when it is synchronized. Both sides
of a pair must then agree: CUDA with CUDA, or host with host."""

import torch

from hvdlite.common import capabilities, collectives, ops, p2p
from hvdlite.common.p2p import P2POp
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch.buffers import TORCH

__all__ = ["P2POp", "batch_isend_irecv", "recv", "recv_async", "send", "send_async"]


def _post(kind, tensor, peer, tag, process_set, name):
    if not TORCH.stage_on_host(tensor):
        return p2p.post(TORCH, kind, tensor, peer, tag, process_set, name)
    if capabilities.nccl_built():
        # NCCL reads and writes a contiguous buffer on the module's own stream: make it
        # first, then let the tensor's stream finish everything queued on it.
        staged = tensor if TORCH.is_direct(tensor) else TORCH.contiguous_copy(tensor)
        torch.cuda.current_stream(tensor.device).synchronize()
        pending = p2p.post(TORCH, kind, staged, peer, tag, process_set, name)
        if staged is tensor:
            return pending
    else:
        staged = tensor.detach().cpu() if kind == p2p.SEND else torch.empty_like(tensor, device="cpu")
        pending = p2p.post(TORCH, kind, staged, peer, tag, process_set, name)

    def finish():
        pending.finish()
        if kind == p2p.SEND:
            return None
        with torch.no_grad():
            tensor.copy_(staged)
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
