"""What both torch distributed optimizers share (DistributedOptimizer and its Adasum
variant): the gradient-ready hook, the bookkeeping state, zero_grad's race check, and
how a wrapped optimizer class is built.

A distributed optimizer is a new class deriving from the user's optimizer class (so
isinstance checks keep working) whose namespace is a copy of a mixin's (see wrap). The
mixins derive from ``HookedOptimizer`` only so that their shared state and methods are
declared once; wrap copies the namespaces of every class between the mixin and
torch.optim.Optimizer.
"""

from typing import Any

import torch

from hvdlite.common import exceptions
from hvdlite.common import optimizer_policy as policy


def register_grad_ready_hook(p, hook):
    """Calls hook() each time a gradient has been accumulated into p.grad.
    Returns what keeps the hook registered."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(lambda _param: hook())
    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
    accumulator.register_hook(lambda *_: hook())
    return accumulator


class HookedOptimizer(torch.optim.Optimizer):
    """State both distributed optimizers keep; never instantiated itself."""

    _hvdlite_distributed = True

    _compression: Any  # a torch Compression (compress / decompress)
    _parameter_names: dict[torch.Tensor, str]
    backward_passes_per_step: int
    _allreduce_delay: dict[torch.Tensor, int]  # backward passes left before the allreduce
    _handles: dict[Any, tuple[Any, Any]]  # param, or tuple of params (a group) -> (handle or None, ctx)
    _hook_refs: list[Any]
    _requires_update: set[torch.Tensor]

    def _init_bookkeeping(self, named_parameters, compression, backward_passes_per_step):
        """Parameter names (validated), compression, the per-parameter countdown of
        backward passes before an allreduce, and the in-flight handles."""
        self._compression = compression
        named = policy.name_parameters(named_parameters, [g["params"] for g in self.param_groups])
        self._parameter_names = {p: name for name, p in sorted(named, key=lambda item: item[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in self._parameter_names}
        self._handles = {}
        self._hook_refs = []
        self._requires_update = set()

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise exceptions.CallOrderError(policy.ZERO_GRAD_RACE)
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def wrap(base_optimizer, mixin, *args):
    """An instance of a new class deriving from the optimizer's own class, with `mixin`'s
    methods (and those of its bases up to torch.optim.Optimizer), built on the original's
    param groups and state."""
    namespace: dict[str, Any] = {}
    for klass in reversed(mixin.__mro__[: mixin.__mro__.index(torch.optim.Optimizer)]):
        namespace.update(klass.__dict__)
    cls = type(base_optimizer.__class__.__name__, (base_optimizer.__class__,), namespace)
    wrapped = cls(base_optimizer.param_groups, *args)
    wrapped.state.update(base_optimizer.state)
    return wrapped
