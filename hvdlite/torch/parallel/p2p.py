"""Stage-to-stage transfer of a list of tensors between two ranks, built on the public
collectives: an allgather on the pair's two-rank process set (registered by hvd.Mesh) where
the sender contributes one packed byte buffer and the receiver contributes nothing. The
packed buffer starts with a header (count, and per tensor dtype, requires_grad, shape), so
any dtypes and shapes travel without a separate negotiation, and every microbatch may have
its own shape.

Blocking and matched: ``send`` returns once the receiver's matching ``recv`` (same name, same
pair) has run; both ranks of a pair must issue their transfers in the same order (the
pipeline schedules guarantee it, hvdlite.parallel.schedules.check verifies it). Errors and
timeouts are the collectives' own. The core has no point-to-point primitive yet; a true
send/recv would save the coordinator round trip and the receiver's empty contribution.
"""

import torch

from hvdlite.common import exceptions
from hvdlite.parallel.mesh import pair_process_set
from hvdlite.torch import mpi_ops

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


def send(tensors, me, peer, name):
    """Sends `tensors` from global rank `me` to `peer`; blocks until `peer` received them."""
    ps = pair_process_set(me, peer)
    mpi_ops.synchronize(mpi_ops.allgather_async(pack(tensors), name=name, process_set=ps))


def recv(me, peer, name, device=None):
    """Receives the tensors `peer` sends under `name`; blocks until they are here."""
    ps = pair_process_set(me, peer)
    empty = torch.empty(0, dtype=torch.uint8)
    return unpack(mpi_ops.synchronize(mpi_ops.allgather_async(empty, name=name, process_set=ps)), device)


def exchange(tensors, me, peer, name):
    """Sends `tensors` to `peer` and returns what `peer` sends in the same exchange (one
    allgather on the pair's set, both contributing); both call it under the same name."""
    ps = pair_process_set(me, peer)
    mine = pack(tensors)
    both = mpi_ops.synchronize(mpi_ops.allgather_async(mine, name=name, process_set=ps))
    n = mine.numel()
    return unpack(both[n:] if me < peer else both[: both.numel() - n])
