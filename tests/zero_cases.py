"""Shared model, data and reference training for the ZeRO tests (tests/test_zero*.py).

Everything here runs inside spawned ranks (tests/helpers.py) and is pickled by name."""

import torch
from torch import nn

GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4 ranks
VOCAB, SEQ, CLASSES = 11, 3, 5


class Net(nn.Module):
    """533 parameters in 12 tensors over nested modules (not divisible by 2, 3 or 4)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 7)
        self.l1 = nn.Linear(7, 13)
        self.block = nn.Sequential(nn.Linear(13, 9), nn.Tanh(), nn.Linear(9, 13))
        self.ln = nn.LayerNorm(13)
        self.head = nn.Linear(13, CLASSES)

    def forward(self, idx):
        x = self.emb(idx).mean(1)
        x = torch.tanh(self.l1(x))
        x = x + self.block(x)
        return self.head(self.ln(x))


def make_model(seed=0):
    torch.manual_seed(seed)
    return Net()


def param_groups(model):
    """Two groups (weights, biases and norms) with different hyperparameters."""
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and "ln" not in n]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and "ln" not in n)]
    return [{"params": decay}, {"params": rest, "weight_decay": 0.0, "lr_scale": 1}]


def make_optimizer(kind, model):
    if kind == "sgd":
        return torch.optim.SGD(param_groups(model), lr=0.1, momentum=0.9, weight_decay=1e-3)
    return torch.optim.AdamW(param_groups(model), lr=1e-2, weight_decay=0.1)


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g)
    y = torch.randint(0, CLASSES, (GLOBAL_BATCH,), generator=g)
    return x, y


def local_batch(step, rank, size):
    x, y = batch(step)
    per = GLOBAL_BATCH // size
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def train_steps(hvd, model, opt, first, count):
    """Steps first .. first+count-1 of the data-parallel run: this rank's share of each batch."""
    for step in range(first, first + count):
        x, y = local_batch(step, hvd.rank(), hvd.size())
        loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()


def reference(kind, steps, start_state=None, first_step=0, clip=None):
    """One process on the concatenated global batch: the state_dict after `steps` steps."""
    model = make_model()
    opt = make_optimizer(kind, model)
    if start_state is not None:
        model.load_state_dict(start_state)
    for step in range(first_step, first_step + steps):
        x, y = batch(step)
        loss_of(model, x, y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_rel_diff(a, b):
    """max over tensors of max|a - b| / max|b|."""
    worst = 0.0
    for k in b:
        scale = max(float(b[k].abs().max()), 1e-12)
        worst = max(worst, float((a[k].float() - b[k].float()).abs().max()) / scale)
    return worst
