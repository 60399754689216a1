"""One rank's mesh shard (the state_dicts of its modules and optimizers) as one flat byte buffer,
self-describing, so that a buddy copy of it (hvdlite/torch/elastic/buddy.py) restores the shard
on a replacement worker that has only built the model for the coordinate, not its state.

Layout of a copy (uint8, `capacity` bytes, the same on every rank of the job so that the buddy
copies have one size):

    [0, 8)    int64: length L of the header
    [8, 16)   int64: offset D of the data (16 + L, rounded up to ALIGN)
    [16, 16+L) the header: pickle of the state_dicts with every tensor replaced by
               (index, dtype, shape, byte offset from D, bytes)
    [D, ...)  every tensor's bytes, each starting at a multiple of ALIGN; zeros up to capacity

Bit-exact for every dtype (tensors travel as their bytes). CUDA tensors are copied to host
memory by pack(); load() puts them back through load_state_dict (which copies to the module's
parameters, and places optimizer state with its parameters). Threading: the caller's.
"""

import pickle

import torch

from hvdlite.common.exceptions import PreconditionError

ALIGN = 16  # every tensor's bytes start aligned, so that views of any dtype are valid
_PREFIX = 16  # two int64 before the header


class _TensorRef(tuple[object, ...]):
    """(index, dtype name, shape, offset, nbytes) of a tensor in the data region."""


def _round(n):
    return -(-n // ALIGN) * ALIGN


def _bytes_of(t):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same_kind(like, items):
    """`items` as a dict of like's type, with its _metadata (a module state_dict's versions)."""
    out = items if type(like) is dict else type(like)(items)
    if hasattr(like, "_metadata"):
        out._metadata = like._metadata
    return out


def encode(states):
    """(header bytes, [uint8 tensors], data bytes) of `states` ({key: state_dict}); the tensors are
    views (no copy) of the state's own CPU tensors, in data order."""
    tensors: list[torch.Tensor] = []
    offset = 0

    def strip(value):
        nonlocal offset
        if torch.is_tensor(value):
            raw = _bytes_of(value)
            ref = _TensorRef(
                (len(tensors), str(value.dtype).split(".")[-1], tuple(value.shape), offset, raw.numel())
            )
            tensors.append(raw)
            offset = _round(offset + raw.numel())
            return ref
        if isinstance(value, dict):
            return _same_kind(value, {k: strip(v) for k, v in value.items()})
        if type(value) in (list, tuple):
            return type(value)(strip(v) for v in value)
        return value

    skeleton = {key: strip(sd) for key, sd in states.items()}
    return pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL), tensors, offset


def size_of(header, data_bytes):
    """The bytes a copy of (header, data) takes."""
    return _round(_PREFIX + len(header)) + data_bytes


def parts(header, tensors, capacity):
    """The uint8 tensors whose concatenation is the copy, `capacity` bytes (>= size_of())."""
    data_at = _round(_PREFIX + len(header))
    head = torch.zeros(data_at, dtype=torch.uint8)
    head[:_PREFIX].view(torch.int64).copy_(torch.tensor([len(header), data_at]))
    head[_PREFIX : _PREFIX + len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    out, used = [head], data_at
    for raw in tensors:
        out.append(raw)
        used += raw.numel()
        pad = _round(used) - used
        if pad:
            out.append(torch.zeros(pad, dtype=torch.uint8))
            used += pad
    if used > capacity:
        raise PreconditionError(
            "mesh shard copy: the state packs into %d bytes, more than the %d every rank agreed on "
            "before packing it (the model or optimizer changed in between)" % (used, capacity)
        )
    if capacity > used:
        out.append(torch.zeros(capacity - used, dtype=torch.uint8))
    return out


def decode(flat):
    """{key: state_dict} of a copy made by parts(); every tensor a fresh one (no view of flat)."""
    length, data_at = flat[:_PREFIX].view(torch.int64).tolist()
    skeleton = pickle.loads(flat[_PREFIX : _PREFIX + length].numpy().tobytes())

    def fill(value):
        if isinstance(value, _TensorRef):
            _, dtype, shape, offset, nbytes = value
            start = data_at + int(offset)  # type: ignore[call-overload]
            raw = flat[start : start + int(nbytes)]  # type: ignore[call-overload]
            return raw.view(getattr(torch, str(dtype))).reshape(shape).clone()
        if isinstance(value, dict):
            return _same_kind(value, {k: fill(v) for k, v in value.items()})
        if type(value) in (list, tuple):
            return type(value)(fill(v) for v in value)
        return value

    return {key: fill(sd) for key, sd in skeleton.items()}
