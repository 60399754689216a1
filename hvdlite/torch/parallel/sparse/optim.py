"""Fused sparse optimizers for sharded embedding tables: they update only the rows a step touched,
on the member that holds them, from the gradient rows that member received (already summed
over every requester and averaged over the set). No dense gradient of a table exists.

  sgd      w[r] -= lr * g[r]
  adagrad  row-wise (FBGEMM's EXACT_ROWWISE_ADAGRAD): one accumulator per row,
           s[r] += mean(g[r]**2) over the row's full width; w[r] -= lr * g[r] / (sqrt(s[r]) + eps)
  adam     lazy Adam (torch.optim.SparseAdam's rule): touched rows only, moments per element,
           one step count per table incremented every step;
           m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
           w -= lr * sqrt(1-b2**t) / (1-b1**t) * m / (sqrt(v) + eps)

State lives beside the shard it serves, so its bytes per member shrink with the shard.
Not thread-safe: called from the autograd engine's thread during backward, one table at a time.
Updates scale the rows before index_add_ (the same products): index_add_ with alpha= took
several times longer on CPU.
"""

import math

import torch

from hvdlite.common import exceptions

OPTIMIZERS = ("sgd", "adagrad", "adam")
DEFAULTS: dict[str, dict[str, object]] = {
    "sgd": {},
    "adagrad": {"eps": 1e-10, "initial_accumulator_value": 0.0},
    "adam": {"betas": (0.9, 0.999), "eps": 1e-8},
}


class RowOptimizer:
    """The optimizer of one shard (`weight`, a 2-D tensor updated in place)."""

    def __init__(self, kind, weight, lr, **options):
        if kind not in OPTIMIZERS:
            raise exceptions.InvalidArgumentError(
                "optimizer must be one of %s, got %r" % (", ".join(OPTIMIZERS), kind)
            )
        unknown = set(options) - set(DEFAULTS[kind])
        if unknown:
            raise exceptions.InvalidArgumentError(
                "optimizer %r takes no option %s (it takes %s)"
                % (kind, ", ".join(sorted(unknown)), ", ".join(DEFAULTS[kind]) or "only lr")
            )
        self.kind, self.weight, self.lr = kind, weight, float(lr)
        self.options = dict(DEFAULTS[kind], **options)
        self.state = self._initial_state()

    def _initial_state(self):
        rows, width = self.weight.shape
        if self.kind == "adagrad":
            init = float(self.options["initial_accumulator_value"])
            return {"sum_sq": torch.full((rows,), init, dtype=torch.float32, device=self.weight.device)}
        if self.kind == "adam":
            zeros = lambda: torch.zeros(rows, width, dtype=torch.float32, device=self.weight.device)  # noqa: E731
            return {"exp_avg": zeros(), "exp_avg_sq": zeros(), "step": torch.zeros((), dtype=torch.int64)}
        return {}

    def state_bytes(self):
        return sum(t.numel() * t.element_size() for t in self.state.values() if t.dim() > 0)

    def needs_row_square_sums(self):
        """Whether update() needs mean(g**2) over the row's full width (row-wise Adagrad)."""
        return self.kind == "adagrad"

    def update(self, rows, grad, row_sq_mean=None):
        """Applies one step to shard rows `rows` (unique, int64) with gradient rows `grad`
        (len(rows) x width). `row_sq_mean`: mean(g**2) over each row's full width, for a
        column-sharded Adagrad table whose row spans several members (default: from `grad`).
        Adam's step count advances on every call, touched rows or not. The caller runs it under
        torch.no_grad() (Exchange._apply, once for all tables of a step)."""
        if self.kind == "adam":
            self.state["step"] += 1
        if rows.numel() == 0:
            return
        device = self.weight.device
        rows, grad = rows.to(device), grad.to(device)
        row_sq_mean = None if row_sq_mean is None else row_sq_mean.to(device)
        if self.kind == "sgd":
            self.weight.index_add_(0, rows, grad * -self.lr)
        elif self.kind == "adagrad":
            self._adagrad(rows, grad, row_sq_mean)
        else:
            self._adam(rows, grad)

    def _adagrad(self, rows, grad, row_sq_mean):
        if row_sq_mean is None:
            row_sq_mean = grad.pow(2).mean(dim=1)
        s = self.state["sum_sq"]
        s.index_add_(0, rows, row_sq_mean)
        denom = s[rows].sqrt().add_(self.options["eps"])
        self.weight.index_add_(0, rows, (grad / denom.unsqueeze(1)).mul_(-self.lr))

    def _adam(self, rows, grad):
        b1, b2 = self.options["betas"]
        eps, t = self.options["eps"], int(self.state["step"])
        m, v = self.state["exp_avg"], self.state["exp_avg_sq"]
        m_rows = m[rows].mul_(b1).add_(grad, alpha=1 - b1)
        v_rows = v[rows].mul_(b2).addcmul_(grad, grad, value=1 - b2)
        m[rows], v[rows] = m_rows, v_rows
        step_size = self.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        self.weight.index_add_(0, rows, (m_rows / v_rows.sqrt().add_(eps)).mul_(-step_size))
