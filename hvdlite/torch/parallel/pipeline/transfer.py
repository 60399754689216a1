"""Stage-to-stage transfer of a list of tensors between two ranks of a pipeline's process
set, on the core's point-to-point send/recv (hvdlite.common.p2p): no coordinator round trip,
no other rank involved.

A transfer t starts with one fixed-size message (tag 2t, FIRST_BYTES): HEADER_WORDS int64
words describing the list (the count, and per tensor dtype, requires_grad and shape), then
room for INLINE_BYTES of data. When the tensors' bytes (each padded to 8) fit that room they
travel inside it and the transfer is that one message: one post on each side, which is what a
small activation's hop costs. Larger lists send each tensor's bytes as its own message (tag
2t + 1, in order; messages of one tag between a pair arrive in order), with no copy: the
sender's (contiguous, host) tensors are the send buffers, the receiver's fresh tensors the
receive buffers. Both sides apply the same rule to the same header, so no flag says which
form a transfer took. Because the first message's size is fixed, a receiver posts its receive
before the sender has sent (``Incoming``): it lands while the receiver computes,
``Incoming.poll`` then posts the tensors' receives if any, and by the time the receiver needs
them they are usually there. Any dtypes and shapes pass without a separate negotiation, so
every microbatch may have its own shape. A list whose description would not fit HEADER_WORDS
travels as one packed byte buffer instead (header word 0 is -1, word 1 its size), inline or
not by the same rule.

``send`` posts the messages and returns at once (the core sends while the caller computes);
the caller keeps the returned ``Outgoing`` and waits for it later (``Outgoing.wait``).
``Incoming(...).wait()`` (and ``recv``) blocks until the tensors are here. Peers are ranks
of the process set. Posted receives count against nothing but the core's receive timeout
(HVDLITE_TIMEOUT_SECONDS from their post): post them a little ahead, not a whole run ahead.
"""

import numpy as np
import torch

from hvdlite.common import exceptions, ops
from hvdlite.common import p2p as core_p2p
from hvdlite.common.process_sets import resolve

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
_ITEM_BYTES = {dt: torch.empty((), dtype=dt).element_size() for dt in _DTYPES}
_ALIGN = 8
HEADER_WORDS = 64
_HEADER_BYTES = 8 * HEADER_WORDS
FIRST_BYTES = 16384  # the first message of every transfer: header, then inline data
INLINE_BYTES = FIRST_BYTES - _HEADER_BYTES
_PACKED = -1


def _padded(nbytes):
    return nbytes + (-nbytes) % _ALIGN


def _nbytes(dtype, shape):
    return torch.Size(shape).numel() * _ITEM_BYTES[dtype]


def _inline_slices(sizes):
    """Where buffers of `sizes` bytes sit inside the first message when they fit its room (one
    slice each, 8-aligned after the header), else None: the one rule both ends apply."""
    slices, offset = [], _HEADER_BYTES
    for n in sizes:
        slices.append(slice(offset, offset + n))
        offset += _padded(n)
    return slices if offset - _HEADER_BYTES <= INLINE_BYTES else None


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
        nbytes = _nbytes(dtype, shape)
        out.append((buf[offset : offset + nbytes].view(dtype).reshape(shape), grad))
        offset += _padded(nbytes)
    return out


class Outgoing:
    """The posted messages and buffers of one transfer; wait() returns once the buffers may
    be freed (the core has them), never waiting for the receiver."""

    __slots__ = ("buffers", "handles")

    def __init__(self, handles, buffers):
        self.handles, self.buffers = handles, buffers

    def wait(self):
        for handle in self.handles:
            _finish(handle)


def _post(kind, array, peer, tag, process_set, name):
    """Posts one message of a transfer: the peers and tags of a pipeline are its own, so the
    lean post (no per-call argument checks) serves; returns the core handle."""
    return core_p2p.post_bytes(kind, array, peer, tag, resolve(process_set), name)


def _finish(handle):
    """Waits for a posted message and releases its handle (ops.wait releases it on error)."""
    ops.wait(handle)
    ops.release(handle)


def send(tensors, peer, tag, process_set):
    """Posts `tensors` to rank `peer` of `process_set` under transfer id `tag`; returns an
    Outgoing at once."""
    words = _describe(tensors)
    if len(words) <= HEADER_WORDS:
        payloads = [_bytes(t).numpy() for t in tensors]
    else:
        packed = pack(tensors).numpy()
        payloads, words = [packed], [_PACKED, packed.size]
    first = np.empty(FIRST_BYTES, dtype=np.uint8)
    header = first[:_HEADER_BYTES].view(np.int64)
    header[: len(words)] = words
    header[len(words) :] = 0
    inline = _inline_slices([b.size for b in payloads])
    for where, b in zip(inline or (), payloads):
        first[where] = b
    handles = [_post(core_p2p.SEND, first, peer, 2 * tag, process_set, "pp.first")]
    if inline is None:
        handles += [_post(core_p2p.SEND, b, peer, 2 * tag + 1, process_set, "pp.data") for b in payloads]
    return Outgoing(handles, [first] + payloads)


class Incoming:
    """One transfer's receive, posted at construction (its first message's receive): poll()
    posts the tensors' own receives once the first message is here (when the data did not
    travel inside it), wait() blocks until the tensors are here."""

    __slots__ = (
        "_buffers",
        "_data",
        "_device",
        "_first",
        "_first_handle",
        "_layout",
        "_peer",
        "_ps",
        "_tag",
    )

    def __init__(self, peer, tag, process_set, device=None):
        self._peer, self._tag, self._ps, self._device = peer, tag, process_set, device
        self._first = np.empty(FIRST_BYTES, dtype=np.uint8)
        self._first_handle = _post(core_p2p.RECV, self._first, peer, 2 * tag, process_set, "pp.first")
        self._data = None  # the tensors' receive handles, once posted ([] when inline)

    def poll(self):
        """Posts the tensors' receives if the first message has arrived (never blocks)."""
        if self._data is None and ops.poll_core(self._first_handle):
            self._post_data()

    def _post_data(self):
        _finish(self._first_handle)
        words = self._first[:_HEADER_BYTES].view(np.int64).tolist()
        if words[0] == _PACKED:
            self._layout, sizes = None, [words[1]]
        else:
            self._layout = _layout(words)
            sizes = [_nbytes(dt, shape) for dt, _, shape in self._layout]
        inline = _inline_slices(sizes)
        if inline is not None:
            self._buffers = [self._first[where] for where in inline]
            self._data = []
            return
        self._buffers = [np.empty(n, dtype=np.uint8) for n in sizes]
        self._data = [
            _post(core_p2p.RECV, b, self._peer, 2 * self._tag + 1, self._ps, "pp.data") for b in self._buffers
        ]

    def wait(self):
        """The transfer's tensors (requires_grad as sent, on `device` when one was given);
        blocks until they are here."""
        if self._data is None:
            self._post_data()
        for handle in self._data or ():
            _finish(handle)
        buffers = [torch.from_numpy(b) for b in self._buffers]
        if self._layout is None:
            received = unpack(buffers[0])
        else:
            received = [
                (b.view(dt).reshape(shape), grad) for b, (dt, grad, shape) in zip(buffers, self._layout)
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
