"""How a member runs its local experts on the rows it received (hvd.parallel.MoE's compute
step): one batched computation over all local experts when their modules allow it, else a
loop over the modules.

Rows arrive member-major: member q's rows for local experts 0..L-1, in that order, with
``recv[q, l]`` rows from member q for expert l. Both paths return the experts' outputs in
that same order and leave every expert's own nn.Parameters as the leaves of the graph, so
DistributedOptimizer, the ``hvd_process_set`` marks and ZeRO see them unchanged.

Batched path: the local experts' parameters (and buffers) are stacked along a new expert
dimension on every call (torch.stack is differentiable, so each expert's Parameter receives
its own slice of the gradient), the rows are scattered into a zero-padded
[L, max rows, ...] tensor, and ``torch.func.vmap`` runs ``torch.func.functional_call`` of
the first expert's module over the expert dimension. Only real rows are gathered back, so
padding rows receive no gradient and add none to the parameters: the result and gradients
are those of the loop (to float rounding of the batched matrix products). This requires an
expert to be *row-wise* (each output row depends only on its input row: no batch
statistics, no reductions over rows) and pure (no in-place buffer updates, no randomness).
"""

import torch
from torch import nn

# Modules whose forward is row-wise and pure on [n, features] inputs, with no buffers. An
# expert is batched automatically only if every module in it (itself included) is exactly
# one of these types (a subclass could override forward).
ROWWISE_MODULES = (
    nn.Sequential,
    nn.Linear,
    nn.LayerNorm,
    nn.Identity,
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.LeakyReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.Softplus,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Hardtanh,
) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def _structure(module):
    return [(n, t.shape, t.dtype, t.device) for n, t in module.named_parameters()] + [
        (n, t.shape, t.dtype, t.device) for n, t in module.named_buffers()
    ]


def batchable(experts, mode):
    """Whether `experts` (a list of modules) can run as one batched computation. mode None:
    only if every submodule's type is in ROWWISE_MODULES; True: the caller asserts the
    experts are row-wise and vmap-able; False: never. Always requires at least two experts
    with the same parameter and buffer names, shapes, dtypes and devices."""
    if mode is False or len(experts) < 2:
        return False
    if mode is None and not all(type(m) in ROWWISE_MODULES for e in experts for m in e.modules()):
        return False
    first = _structure(experts[0])
    return all(_structure(e) == first for e in experts[1:])


def run_loop(experts, rows, recv):
    """Runs expert l on its rows, one module after the other (an expert with zero rows still
    runs on an empty tensor, so its gradients are zeros rather than None)."""
    perm = _expert_major(recv)
    counts = recv.sum(dim=0).tolist()
    outs = []
    start = 0
    for module, n in zip(experts, counts):
        outs.append(module(rows[perm[start : start + n]]))
        start += n
    done = torch.cat(outs)
    back = torch.empty_like(perm).index_copy_(0, perm, torch.arange(len(perm)))
    return done[back]


def run_batched(experts, rows, recv):
    """One vmap over the expert dimension of a zero-padded [L, max rows, ...] tensor."""
    L = len(experts)
    width = int(recv.sum(dim=0).max()) if recv.numel() else 0
    dest = _padded_slots(recv, width)
    feat = rows.shape[1:]
    padded = rows.new_zeros((L * width, *feat)).index_copy(0, dest, rows).reshape(L, width, *feat)
    params = {
        n: torch.stack([dict(e.named_parameters())[n] for e in experts])
        for n, _ in experts[0].named_parameters()
    }
    buffers = {
        n: torch.stack([dict(e.named_buffers())[n] for e in experts]) for n, _ in experts[0].named_buffers()
    }
    skeleton = experts[0]

    def one(p, b, x):
        return torch.func.functional_call(skeleton, (p, b), (x,))

    out = torch.func.vmap(one)(params, buffers, padded)
    return out.reshape(L * width, *out.shape[2:])[dest]


def _padded_slots(recv, width):
    """For each received row (member-major order), its index in the flattened [L, width]
    padded layout: expert l's rows from members 0..P-1 fill row l from position 0."""
    members, L = recv.shape
    flat = recv.reshape(-1)
    block = torch.repeat_interleave(torch.arange(members * L), flat)  # (q, l) block of each row
    within = torch.arange(len(block)) - (flat.cumsum(0) - flat)[block]
    before = (recv.cumsum(dim=0) - recv).reshape(-1)  # rows of expert l from members < q
    return (block % L) * width + before[block] + within


def _expert_major(recv):
    """Indices that reorder rows received member-major (member q's rows for its local
    experts 0..L-1) into expert-major order (expert l's rows from members 0..P-1)."""
    members, L = recv.shape
    offsets = recv.reshape(-1).cumsum(0) - recv.reshape(-1)
    offsets = offsets.reshape(members, L)
    pieces = [
        torch.arange(int(offsets[q, i]), int(offsets[q, i] + recv[q, i]))
        for i in range(L)
        for q in range(members)
    ]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
