"""``mode="auto"`` of context_parallel_attention: the fastest mode for a shape, measured.

The first call with a new shape (sequence length, batch, heads, key heads, head size, dtype,
causal, packing, process set) runs every available mode's forward pass twice on the call's own
inputs and times the second; the members take the slowest member's time of each mode (one Max
allreduce), so all choose the same mode, and the choice is kept for later calls of that shape.
Ring mode is a candidate only where hvdlite has point-to-point. The key holds only values every
member shares (not its local token count, which may differ by one), so every member measures
on the same calls: the contract is the attention's (collective, same order on every member).
"""

import time

import torch

from hvdlite.common import dtypes
from hvdlite.torch import conjugate
from hvdlite.torch.parallel.cp import ring as cp_ring

_CHOSEN: dict[tuple[object, ...], str] = {}


def candidates():
    """The modes auto chooses from, in a fixed order (the same on every member)."""
    return ["ulysses", "allgather"] + (["ring"] if cp_ring.available() else [])


def _key(q, k, layout, ps):
    packed = None if layout.cu_seqlens is None else tuple(layout.cu_seqlens.tolist())
    return (
        ps.process_set_id,
        layout.seq_len,
        q.shape[0],
        q.shape[1],
        k.shape[1],
        q.shape[3],
        str(q.dtype),
        layout.causal,
        packed,
    )


def choose(q, k, v, layout, ps, scale, run_mode):
    """The mode to run for this shape (measured on first use; collective then)."""
    key = _key(q, k, layout, ps)
    if key not in _CHOSEN:
        modes = candidates()
        spent = []
        with torch.no_grad():
            for mode in modes:
                run_mode(mode, q.detach(), k.detach(), v.detach(), layout, ps, scale)
                start = time.perf_counter()
                run_mode(mode, q.detach(), k.detach(), v.detach(), layout, ps, scale)
                spent.append(time.perf_counter() - start)
        slowest = conjugate.allreduce_now(torch.tensor(spent, dtype=torch.float64), dtypes.Max, None, ps)
        _CHOSEN[key] = modes[int(torch.argmin(slowest))]
    return _CHOSEN[key]


def chosen():
    """{shape key: mode} chosen so far in this process (for reports and tests)."""
    return dict(_CHOSEN)
