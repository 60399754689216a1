"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer.

Adasum combines model updates, not raw gradients: as soon as a parameter's
gradient is ready, the wrapped optimizer steps on that parameter alone, the
update delta = new - start is Adasum-allreduced across ranks (in place, in
the parameter's memory; see hvdlite.common.adasum), and step() sets
parameter = start + combined delta. The number of ranks must be a power of two.
"""

import torch

from hvdlite.common import dtypes, exceptions
from hvdlite.common import optimizer_policy as policy
from hvdlite.torch import mpi_ops
from hvdlite.torch.optimizer_base import HookedOptimizer, register_grad_ready_hook


class _DistributedAdasumOptimizer(HookedOptimizer):
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1):
        # The wrapped class's __init__ (SGD, Adam, ...) takes the params alone.
        super(self.__class__, self).__init__(params)  # type: ignore[call-arg]
        self._init_bookkeeping(named_parameters, compression, backward_passes_per_step)
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for p in self._parameter_names}
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._hook_refs.append(register_grad_ready_hook(p, self._make_hook(p)))

    def _step_one(self, p):
        """The wrapped optimizer's step on parameter p only."""
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params

    def _allreduce_grad_async(self, p):
        start = self._starting_models[p]
        with torch.no_grad():
            start.copy_(p)
            self._step_one(p)
            p.sub_(start)  # p now holds this rank's update
        compressed, ctx = self._compression.compress(p.detach())
        handle = mpi_ops.allreduce_async_(compressed, name=self._parameter_names.get(p), op=dtypes.Adasum)
        return handle, ctx

    def _make_hook(self, p):
        def hook():
            if self._allreduce_delay[p] <= 0:
                raise exceptions.CallOrderError(policy.TOO_MANY_BACKWARD_PASSES)
            self._allreduce_delay[p] -= 1
            self._handles[p] = (
                self._allreduce_grad_async(p) if self._allreduce_delay[p] == 0 else (None, None)
            )

        return hook

    def synchronize(self):
        """Nothing to do: step() applies the combined updates."""

    def skip_synchronize(self):
        """Raises at once, as Horovod's does: step() is where Adasum's updates are combined,
        so `with opt.skip_synchronize():` cannot skip it."""
        raise exceptions.CallOrderError(
            "Skipping synchronization is not supported when using Adasum optimizer."
        )

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in sorted(self._requires_update - set(self._handles), key=lambda q: self._parameter_names[q]):
            self._handles[p] = (None, None)
        for p in sorted(self._handles, key=lambda q: self._parameter_names[q]):
            if self._handles[p][0] is None:  # backward_passes_per_step not reached, or no backward
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            delta = self._compression.decompress(mpi_ops.synchronize(handle), ctx)
            start = self._starting_models[p]
            with torch.no_grad():
                start.add_(delta)
                p.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss
