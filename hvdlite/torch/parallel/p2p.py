"""Stage-to-stage transfer of a list of tensors between two ranks of a pipeline's process
set, on the core's point-to-point send/recv (hvdlite.torch.send_async / recv_async): no
coordinator round trip, no other rank involved. The tensors travel as one packed byte buffer
whose header (count, and per tensor dtype, requires_grad, shape) lets any dtypes and shapes
pass without a separate negotiation, so every microbatch may have its own shape. Because the
receiver cannot know the packed size in advance, a transfer is two messages: the size
(tag 2t), then the buffer (tag 2t + 1), where t identifies the transfer.

``send`` posts both messages and returns at once (the core sends while the caller computes);
the caller keeps the returned ``Outgoing`` and waits for it later (``Outgoing.wait``).
``recv`` blocks until the message is here. Peers are ranks of the process set.
"""

import torch

from hvdlite.common import exceptions
from hvdlite.torch import mpi_ops, p2p_ops

_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_ALIGN = 8


def _bytes(t):
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def pack(tensors):
    """One uint8 tensor holding `tensors` (CPU copies) and the header that describes them."""
    header = [len(tensors)]
    parts = []
    for t in tensors:
        if t.dtype not in _CODE:
            raise exceptions.NotSupportedError(
                "pipeline transfer of dtype %s is not supported; use one of %s" % (t.dtype, _DTYPES)
            )
        header += [_CODE[t.dtype], int(t.requires_grad), t.dim()] + list(t.shape)
        b = _bytes(t.cpu())
        pad = (-b.numel()) % _ALIGN
        parts += [b, torch.zeros(pad, dtype=torch.uint8)] if pad else [b]
    head = torch.tensor([len(header)] + header, dtype=torch.int64).view(torch.uint8)
    return torch.cat([head] + parts)


def unpack(buf, device=None):
    """The tensors of a packed buffer (fresh storage each; requires_grad as sent)."""
    n_header = int(buf[:8].clone().view(torch.int64)[0])
    header = buf[8 : 8 * (1 + n_header)].clone().view(torch.int64).tolist()
    offset, pos, out = 8 * (1 + n_header), 1, []
    for _ in range(header[0]):
        code, grad, ndim = header[pos : pos + 3]
        shape = header[pos + 3 : pos + 3 + ndim]
        pos += 3 + ndim
        dtype = _DTYPES[code]
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        t = buf[offset : offset + nbytes].clone().view(dtype).reshape(shape)
        offset += nbytes + (-nbytes) % _ALIGN
        if device is not None:
            t = t.to(device)
        out.append(t.requires_grad_() if grad and t.is_floating_point() else t)
    return out


class Outgoing:
    """The handles and buffers of one posted transfer; wait() returns once the buffers may be
    freed (the core has them), never waiting for the receiver."""

    __slots__ = ("buffers", "handles")

    def __init__(self, handles, buffers):
        self.handles, self.buffers = handles, buffers

    def wait(self):
        for h in self.handles:
            mpi_ops.synchronize(h)


def send(tensors, peer, tag, process_set):
    """Posts `tensors` to rank `peer` of `process_set` under transfer id `tag`; returns an
    Outgoing at once."""
    buf = pack(tensors)
    size = torch.tensor([buf.numel()], dtype=torch.int64)
    handles = [
        p2p_ops.send_async(size, peer, 2 * tag, process_set, name="pp.size"),
        p2p_ops.send_async(buf, peer, 2 * tag + 1, process_set, name="pp.data"),
    ]
    return Outgoing(handles, (size, buf))


def recv(peer, tag, process_set, device=None):
    """Receives the tensors rank `peer` of `process_set` sends under transfer id `tag`;
    blocks until they are here."""
    size = torch.zeros(1, dtype=torch.int64)
    p2p_ops.recv(size, peer, 2 * tag, process_set, name="pp.size")
    buf = torch.empty(int(size[0]), dtype=torch.uint8)
    p2p_ops.recv(buf, peer, 2 * tag + 1, process_set, name="pp.data")
    return unpack(buf, device)
