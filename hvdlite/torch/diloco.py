"""hvd.DiLoCo: local SGD with an outer optimizer (DiLoCo, Douillard et al., 2023).

Each rank steps its inner optimizer on its own data; every ``sync_every`` steps the
ranks average the parameter delta since the last sync (outer weights minus local
weights, one fused allreduce) and an outer SGD step with Nesterov momentum moves the
outer weights, which every rank then loads into its model. Traffic: one allreduce of
the parameters per ``sync_every`` steps instead of one of the gradients per step.

Contracts: construction and every ``step()`` that ends a sync are collectives over
``process_set`` (every member must call them the same number of times); a sync blocks
until its allreduce completes (bounded by the core's timeouts). When such a step
returns, every replica holds the same weights, bit for bit (with ``overlap=True`` the sync
completes one step later and the replicas share the outer weights only: see DiLoCo). ``outer_lr=1.0,
outer_momentum=0.0`` is plain local SGD: the weights become exactly the average of the
ranks' weights. The inner optimizer's state (momentum, Adam's moments) stays local.
Floating-point buffers (BatchNorm statistics) are averaged at each sync.
"""

from typing import Any

import torch

from hvdlite.common import dtypes, exceptions
from hvdlite.common.objects import broadcast_object
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch import mpi_ops
from hvdlite.torch.functions import broadcast_optimizer_state, broadcast_parameters


def _check(inner_optimizer, sync_every, outer_lr, outer_momentum):
    if getattr(inner_optimizer, "_hvdlite_distributed", False):
        raise exceptions.InvalidArgumentError(
            "DiLoCo's inner optimizer must be a plain torch optimizer (its steps are local); got a"
            " DistributedOptimizer: pass the optimizer it wraps"
        )
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise exceptions.InvalidArgumentError(
            "DiLoCo sync_every must be an integer >= 1, got %r" % (sync_every,)
        )
    if not outer_lr > 0.0:
        raise exceptions.InvalidArgumentError("DiLoCo outer_lr must be > 0, got %r" % (outer_lr,))
    if not 0.0 <= outer_momentum < 1.0:
        raise exceptions.InvalidArgumentError(
            "DiLoCo outer_momentum must be in [0, 1), got %r" % (outer_momentum,)
        )


class DiLoCo:
    """``opt = hvd.DiLoCo(model, inner_optimizer, sync_every=8, outer_lr=0.7,
    outer_momentum=0.9)``; then every step: ``opt.zero_grad(); loss.backward();
    opt.step()``. Construction broadcasts rank 0's parameters and buffers so that every
    replica starts from the same outer weights.

    ``overlap=True`` overlaps each sync with the next inner step (a one-step delayed outer
    update, after streaming DiLoCo): the step that ends an interval only starts the
    allreduce, and the next step() completes it and sets each rank's weights to the new
    outer weights plus the inner step this rank took meanwhile. So replicas then share the
    outer weights (``outer_weights()``) but not the weights themselves, which differ by one
    inner step each; ``synchronize()`` makes them equal. state_dict() completes a sync in
    flight first (a collective then)."""

    def __init__(
        self,
        model,
        inner_optimizer,
        sync_every=8,
        outer_lr=0.7,
        outer_momentum=0.9,
        overlap=False,
        process_set=global_process_set,
        name="DiLoCo",
    ):
        _check(inner_optimizer, sync_every, outer_lr, outer_momentum)
        self.overlap = bool(overlap)
        self._pending: Any = None  # (handle, snapshot or None): the sync in flight
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.sync_every = sync_every
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self.process_set = process_set
        self.name = name
        named = sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._buffers = sorted(
            (n, b) for n, b in model.named_buffers() if b is not None and b.dtype.is_floating_point
        )
        broadcast_parameters(named + self._buffers, root_rank=0, process_set=process_set)
        self._outer = [p.detach().clone() for p in self._params]
        self._momentum = [torch.zeros_like(p) for p in self._params] if self.outer_momentum else None
        self.inner_steps = 0
        self.syncs = 0

    @property
    def param_groups(self):
        return self.inner_optimizer.param_groups

    def zero_grad(self, *args, **kwargs):
        return self.inner_optimizer.zero_grad(*args, **kwargs)

    def step(self, closure=None):
        """An inner step; every sync_every-th also syncs (a collective). Without overlap the
        sync blocks until the weights are the new outer weights; with overlap it only starts,
        and the next step() completes it."""
        loss = self.inner_optimizer.step(closure)
        self.inner_steps += 1
        if self._pending is not None:
            self._finish_sync()
        if self.inner_steps % self.sync_every == 0:
            self._start_sync(snapshot=self.overlap)
            if not self.overlap:
                self._finish_sync()
        return loss

    def _local_sgd(self):
        return self.outer_lr == 1.0 and self.outer_momentum == 0.0

    @torch.no_grad()
    def _start_sync(self, snapshot):
        """Submits the average of the deltas (or, for local SGD, of the weights themselves:
        the result is then exactly the average, not outer minus the mean delta) and of the
        floating-point buffers, in one fused allreduce; with `snapshot`, remembers the
        weights sent so that the inner steps taken meanwhile can be replayed on top."""
        if self._local_sgd():
            sent = [p.detach().clone() for p in self._params]
        else:
            sent = [o - p.detach() for o, p in zip(self._outer, self._params)]
        buffers = [b.detach().clone() for _, b in self._buffers]
        handle = mpi_ops.grouped_allreduce_async_(
            sent + buffers, name="%s.sync" % self.name, op=dtypes.Average, process_set=self.process_set
        )
        self._pending = (handle, [p.detach().clone() for p in self._params] if snapshot else None)

    @torch.no_grad()
    def _finish_sync(self):
        """Waits for the sync in flight (bounded by the core's timeouts) and applies it."""
        handle, snapshot = self._pending
        self._pending = None
        averaged = mpi_ops.synchronize(handle)
        count = len(self._params)
        if self._local_sgd():
            self._outer = list(averaged[:count])
        else:
            self._outer_step(averaged[:count])
        for i, p in enumerate(self._params):
            if snapshot is None:
                p.copy_(self._outer[i])
            else:  # overlap: the outer weights plus this rank's inner steps since the sync began
                p.copy_(self._outer[i] + (p - snapshot[i]))
        for (_, b), a in zip(self._buffers, averaged[count:]):
            b.copy_(a)
        self.syncs += 1

    def synchronize(self):
        """Syncs now, blocking (a collective): completes a sync in flight, then averages the
        ranks' progress and applies the outer step; the weights are then the outer weights."""
        if self._pending is not None:
            self._finish_sync()
        self._start_sync(snapshot=False)
        self._finish_sync()

    def outer_weights(self):
        """The outer weights (equal on every rank), in the order of sorted parameter names."""
        return dict(zip(self._names, self._outer))

    def _outer_step(self, deltas):
        """SGD with Nesterov momentum on the averaged delta (the outer gradient)."""
        for i, delta in enumerate(deltas):
            update = delta
            if self._momentum is not None:
                self._momentum[i].mul_(self.outer_momentum).add_(delta)
                update = delta.add(self._momentum[i], alpha=self.outer_momentum)
            self._outer[i].sub_(update, alpha=self.outer_lr)

    def state_dict(self):
        """The inner optimizer's state_dict, the outer weights and momentum, the step count."""
        if self._pending is not None:
            self._finish_sync()
        return {
            "inner": self.inner_optimizer.state_dict(),
            "outer": [o.clone() for o in self._outer],
            "momentum": None if self._momentum is None else [m.clone() for m in self._momentum],
            "inner_steps": self.inner_steps,
            "syncs": self.syncs,
        }

    def broadcast_state(self, root_rank=0):
        """Makes every rank's outer weights, outer momentum, step counts and inner optimizer
        state root_rank's (a collective; hvd.elastic.TorchState's sync after a reset)."""
        self._pending = None  # a sync in flight died with the job it ran in
        tensors = list(self._outer) + (list(self._momentum) if self._momentum is not None else [])
        broadcast_parameters(tensors, root_rank, self.process_set)
        counts = broadcast_object(
            (self.inner_steps, self.syncs),
            root_rank,
            name="%s.counts" % self.name,
            process_set=self.process_set,
        )
        self.inner_steps, self.syncs = counts
        broadcast_optimizer_state(self.inner_optimizer, root_rank, process_set=self.process_set)

    def load_state_dict(self, state):
        if len(state["outer"]) != len(self._params):
            raise exceptions.InvalidArgumentError(
                "DiLoCo state holds %d outer tensors, this model has %d parameters"
                % (len(state["outer"]), len(self._params))
            )
        self.inner_optimizer.load_state_dict(state["inner"])
        self._outer = [o.clone().to(p.device) for o, p in zip(state["outer"], self._params)]
        if self._momentum is not None and state["momentum"] is not None:
            self._momentum = [m.clone().to(p.device) for m, p in zip(state["momentum"], self._params)]
        self._pending = None
        self.inner_steps = int(state["inner_steps"])
        self.syncs = int(state["syncs"])
