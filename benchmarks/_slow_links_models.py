"""The models and data of benchmarks/slow_links.py: an MLP and a CNN on scikit-learn's digits,
and a small GPT on bytes of text (the standard library's own sources, the same on every
machine with this Python). Each rank draws its own batches from a generator seeded by
(step, rank), so a run is reproducible and the ranks see different data.
"""

import inspect
import math

import torch
import torch.nn.functional as F


def digits():
    """(x_train, y_train, x_test, y_test): the 1797 8x8 digits scaled to [0, 1], 360 held out."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x = torch.tensor(x, dtype=torch.float32)[perm] / 16.0
    y = torch.tensor(y, dtype=torch.long)[perm]
    return x[360:], y[360:], x[:360], y[:360]


def text_bytes():
    """(train, test) byte tensors: the source of a few standard-library modules."""
    import argparse
    import collections
    import json.decoder
    import textwrap

    src = "".join(inspect.getsource(m) for m in (argparse, collections, textwrap, json.decoder))
    data = torch.tensor(list(src.encode("utf-8")), dtype=torch.long)
    cut = int(0.9 * data.numel())
    return data[:cut], data[cut:]


class MLP(torch.nn.Sequential):
    """64 -> 1024 -> 1024 -> 10 (1.1M parameters): the issue's goal run."""

    def __init__(self):
        super().__init__(
            torch.nn.Linear(64, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 10),
        )

    def forward(self, x):
        return super().forward(x.flatten(1))


class CNN(torch.nn.Module):
    """8x8 grey digits -> 10 classes: three 3x3 convolutions (32, 64, 128 channels), one
    pooling, a 512-wide dense layer (0.67M parameters, 0.1M of them convolutions)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = torch.nn.Linear(128 * 4 * 4, 256)
        self.fc2 = torch.nn.Linear(256, 10)

    def forward(self, x):
        x = x.view(-1, 1, 8, 8)
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.fc = torch.nn.Linear(dim, 4 * dim)
        self.out = torch.nn.Linear(4 * dim, dim)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    """A byte-level decoder: 256-token vocabulary, `layers` pre-norm blocks of width `dim`,
    learned positions, untied head (2 layers x 128: 0.47M parameters)."""

    def __init__(self, dim=128, layers=2, heads=4, context=64):
        super().__init__()
        self.tok = torch.nn.Embedding(256, dim)
        self.pos = torch.nn.Parameter(torch.zeros(context, dim))
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, 256)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class Task:
    """One model and its data: batch(step, rank) -> (inputs, targets); loss(out, y);
    accuracy(model) on the held-out data (next-byte accuracy for the GPT)."""

    def __init__(self, name, batch):
        self.name, self.batch_size = name, batch
        if name == "gpt":
            self.train, self.test = text_bytes()
            self.context = 64
        else:
            self.x, self.y, self.x_test, self.y_test = digits()

    def model(self):
        torch.manual_seed(0)
        return {"mlp": MLP, "cnn": CNN, "gpt": GPT}[self.name]()

    def batch(self, step, rank):
        g = torch.Generator().manual_seed(1000003 * step + rank)
        if self.name == "gpt":
            starts = torch.randint(self.train.numel() - self.context - 1, (self.batch_size,), generator=g)
            rows = torch.stack([self.train[s : s + self.context + 1] for s in starts.tolist()])
            return rows[:, :-1], rows[:, 1:]
        idx = torch.randint(len(self.y), (self.batch_size,), generator=g)
        return self.x[idx], self.y[idx]

    def loss(self, out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    @torch.no_grad()
    def accuracy(self, model):
        model.eval()
        if self.name == "gpt":
            n = (self.test.numel() - 1) // self.context
            rows = self.test[: n * self.context + 1]
            x, y = rows[:-1].view(n, self.context), rows[1:].view(n, self.context)
        else:
            x, y = self.x_test, self.y_test
        pred = model(x).argmax(-1)
        model.train()
        return float((pred == y).float().mean())


def params(model):
    return sum(p.numel() for p in model.parameters())


def ema(values, beta=0.9):
    """Exponential moving average (bias-corrected) of a loss curve."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc = beta * acc + (1 - beta) * v
        out.append(acc / (1 - beta ** (i + 1)))
    return out


def first_below(times, losses, target):
    for t, v in zip(times, losses):
        if v <= target and not math.isnan(v):
            return t
    return None
