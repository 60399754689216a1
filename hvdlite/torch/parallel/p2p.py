"""Stage-to-stage transfer of a list of tensors between two ranks of a pipeline's process
set, on the core's point-to-point send/recv (hvdlite.torch.send_async / recv_async): no
coordinator round trip, no other rank involved.

A transfer t is a fixed-size header message (tag 2t: HEADER_WORDS int64 words holding the
count, and per tensor dtype, requires_grad and shape), then each tensor's bytes as its own
message (tag 2t + 1, in order; messages of one tag between a pair arrive in order). Because
the header's size is fixed, a receiver posts its receive before the sender has sent
(``Incoming``): the header lands while the receiver computes, ``Incoming.poll`` then posts
the tensors' receives into freshly allocated tensors, and by the time the receiver needs
them they are usually there. Nothing is packed or copied in Python on either side: the
sender's (contiguous, host) tensors are the send buffers, the receiver's tensors the
receive buffers. Any dtypes and shapes pass without a separate negotiation, so every
microbatch may have its own shape. A list whose header would not fit HEADER_WORDS travels
as one packed byte message instead (header word 0 is -1, word 1 its size).

``send`` posts the messages and returns at once (the core sends while the caller computes);
the caller keeps the returned ``Outgoing`` and waits for it later (``Outgoing.wait``).
``Incoming(...).wait()`` (and ``recv``) blocks until the tensors are here. Peers are ranks
of the process set. Posted receives count against nothing but the core's receive timeout
(HVDLITE_TIMEOUT_SECONDS from their post): post them a little ahead, not a whole run ahead.
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
HEADER_WORDS = 64
_PACKED = -1


def _bytes(t):
    """t's elements as a flat uint8 tensor on the host (t itself when it already is one)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def _describe(tensors):
    """[count, (dtype code, requires_grad, ndim, *shape) per tensor]."""
    words = [len(tensors)]
    for t in tensors:
        if t.dtype not in _CODE:
            raise exceptions.NotSupportedError(
                "pipeline transfer of dtype %s is not supported; use one of %s" % (t.dtype, _DTYPES)
            )
        words += [_CODE[t.dtype], int(t.requires_grad), t.dim()] + list(t.shape)
    return words


def _layout(words):
    """(dtype, requires_grad, shape) per tensor of a description made by _describe."""
    pos, out = 1, []
    for _ in range(words[0]):
        code, grad, ndim = words[pos : pos + 3]
        out.append((_DTYPES[code], bool(grad), words[pos + 3 : pos + 3 + ndim]))
        pos += 3 + ndim
    return out


def pack(tensors):
    """One uint8 tensor holding `tensors` (host copies) and their description (the fallback
    for lists too long for HEADER_WORDS)."""
    words = _describe(tensors)
    parts = []
    for t in tensors:
        b = _bytes(t)
        pad = (-b.numel()) % _ALIGN
        parts += [b, torch.zeros(pad, dtype=torch.uint8)] if pad else [b]
    head = torch.tensor([len(words)] + words, dtype=torch.int64).view(torch.uint8)
    return torch.cat([head] + parts)


def unpack(buf):
    """The host tensors of a packed buffer (views into `buf`, which the caller owns alone)."""
    n_words = int(buf[:8].clone().view(torch.int64)[0])
    words = buf[8 : 8 * (1 + n_words)].clone().view(torch.int64).tolist()
    offset, out = 8 * (1 + n_words), []
    for dtype, grad, shape in _layout(words):
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        out.append((buf[offset : offset + nbytes].view(dtype).reshape(shape), grad))
        offset += nbytes + (-nbytes) % _ALIGN
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
    words = _describe(tensors)
    if len(words) <= HEADER_WORDS:
        payloads = [_bytes(t) for t in tensors]
    else:
        payloads = [pack(tensors)]
        words = [_PACKED, payloads[0].numel()]
    header = torch.zeros(HEADER_WORDS, dtype=torch.int64)
    header[: len(words)] = torch.tensor(words, dtype=torch.int64)
    handles = [p2p_ops.send_async(header, peer, 2 * tag, process_set, name="pp.header")]
    handles += [p2p_ops.send_async(b, peer, 2 * tag + 1, process_set, name="pp.data") for b in payloads]
    return Outgoing(handles, [header] + payloads)


class Incoming:
    """One transfer's receive, posted at construction (its header's receive): poll() posts
    the tensors' receives once the header is here, wait() blocks until the tensors are."""

    __slots__ = (
        "_buffers",
        "_data",
        "_device",
        "_header",
        "_header_handle",
        "_layout",
        "_peer",
        "_ps",
        "_tag",
    )

    def __init__(self, peer, tag, process_set, device=None):
        self._peer, self._tag, self._ps, self._device = peer, tag, process_set, device
        self._header = torch.zeros(HEADER_WORDS, dtype=torch.int64)
        self._header_handle = p2p_ops.recv_async(self._header, peer, 2 * tag, process_set, name="pp.header")
        self._data = None  # the tensors' receive handles, once posted

    def poll(self):
        """Posts the tensors' receives if the header has arrived (never blocks)."""
        if self._data is None and mpi_ops.poll(self._header_handle):
            self._post_data()

    def _post_data(self):
        mpi_ops.synchronize(self._header_handle)
        words = self._header.tolist()
        if words[0] == _PACKED:
            self._layout = None
            self._buffers = [torch.empty(words[1], dtype=torch.uint8)]
        else:
            self._layout = _layout(words)
            self._buffers = [
                torch.empty(
                    torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size(), dtype=torch.uint8
                )
                for dt, _, shape in self._layout
            ]
        self._data = [
            p2p_ops.recv_async(b, self._peer, 2 * self._tag + 1, self._ps, name="pp.data")
            for b in self._buffers
        ]

    def wait(self):
        """The transfer's tensors (fresh storage, requires_grad as sent, on `device` when one
        was given); blocks until they are here."""
        if self._data is None:
            self._post_data()
        for h in self._data or ():
            mpi_ops.synchronize(h)
        if self._layout is None:
            received = unpack(self._buffers[0])
        else:
            received = [
                (b.view(dt).reshape(shape), grad) for b, (dt, grad, shape) in zip(self._buffers, self._layout)
            ]
        out = []
        for t, grad in received:
            if self._device is not None:
                t = t.to(self._device)
            out.append(t.requires_grad_() if grad and t.is_floating_point() else t)
        return out


def recv(peer, tag, process_set, device=None):
    """Receives the tensors rank `peer` of `process_set` sends under transfer id `tag`;
    blocks until they are here."""
    return Incoming(peer, tag, process_set, device).wait()
