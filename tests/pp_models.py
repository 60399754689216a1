"""Shared by the pipeline and 3-D tests: a small model cut into stage chunks, and its
single-process reference (loss and gradients on the whole batch)."""

import torch
from torch import nn

WIDTH = 6


class Chunk(nn.Module):
    """One pipeline stage: tanh(linear) scaled by the `gain` keyword (which every stage gets),
    carrying a skip sum along; the last chunk ends in a head. Returns (h, skip) elsewhere, so
    stages pass two tensors that both need gradients."""

    def __init__(self, last):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 3) if last else None

    def forward(self, h, skip=None, gain=None):
        skip = torch.zeros_like(h) if skip is None else skip
        h = torch.tanh(self.lin(h)) * gain
        skip = skip + h
        if self.head is not None:
            return self.head(h + skip)
        return h, skip


def chunks(n):
    torch.manual_seed(0)
    return [Chunk(i == n - 1) for i in range(n)]


def batch(rows=12):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, WIDTH, generator=g)
    y = torch.randn(rows, 3, generator=g)
    gain = 0.5 + torch.rand(rows, 1, generator=g)
    return x, y, gain


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


def reference(n_stages, rows=12):
    """(loss, {stage: [grad of each parameter]}) of one process on the whole batch."""
    torch.set_num_threads(1)
    model = chunks(n_stages)
    x, y, gain = batch(rows)
    h, skip = x, None
    for c in model[:-1]:
        h, skip = c(h, skip, gain=gain)
    loss = loss_fn(model[-1](h, skip, gain=gain), y)
    loss.backward()
    return float(loss.detach()), {
        i: [p.grad.numpy().copy() for p in c.parameters()] for i, c in enumerate(model)
    }
