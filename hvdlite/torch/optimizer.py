"""DistributedOptimizer: wraps a torch optimizer so that each gradient is
allreduced across ranks as soon as backward has produced it.

A hook on every parameter (``register_post_accumulate_grad_hook``, or the
gradient accumulator's hook on torch < 2.1) submits that parameter's gradient
to the core the moment it is accumulated, so communication overlaps the rest
of backward and the core fuses what is ready together. ``step()`` waits for
the outstanding allreduces, writes the results into ``p.grad``, then steps.
"""

import warnings
from contextlib import contextmanager

import torch

from hvdlite.common import dtypes, exceptions
from hvdlite.common import optimizer_policy as policy
from hvdlite.common.compressors import STATE_KEY, check_reduction
from hvdlite.common.objects import broadcast_object
from hvdlite.common.process_sets import global_process_set
from hvdlite.common.reduction import check_predivide, gradient_scale_factors
from hvdlite.torch import mpi_ops
from hvdlite.torch.adasum_optimizer import _DistributedAdasumOptimizer
from hvdlite.torch.compression import Compression
from hvdlite.torch.optimizer_base import HookedOptimizer, register_grad_ready_hook, wrap


class _DistributedOptimizer(HookedOptimizer):
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def __init__(
        self,
        params,
        named_parameters,
        compression,
        backward_passes_per_step=1,
        op=dtypes.Average,
        gradient_predivide_factor=1.0,
        groups=None,
        sparse_as_dense=False,
        process_set=global_process_set,
    ):
        # The wrapped class's __init__ (SGD, Adam, ...) takes the params alone.
        super(self.__class__, self).__init__(params)  # type: ignore[call-arg]
        self._init_bookkeeping(named_parameters, compression, backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._synchronized = False
        self._should_synchronize = True
        policy.check_groups(groups, torch.is_tensor)
        if self._stateful_compression():
            _check_stateful(compression, op, groups)
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}
        if self.process_set.included():
            self._register_hooks()

    def _stateful_compression(self):
        return getattr(self._compression, "stateful", False)

    def state_dict(self):
        """The wrapped optimizer's state_dict; with a stateful compressor also its state
        under "hvdlite_compression" (this rank's residuals, the shared step counters and
        PowerSGD's Q): residuals are per rank, so each rank checkpoints its own."""
        state = super(self.__class__, self).state_dict()
        if self._stateful_compression():
            state[STATE_KEY] = self._compression.state_dict()
        return state

    def load_state_dict(self, state_dict):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        if STATE_KEY in state_dict:
            state_dict = dict(state_dict)
            compression_state = state_dict.pop(STATE_KEY)
            if self._stateful_compression():
                self._compression.load_state_dict(compression_state)
        super(self.__class__, self).load_state_dict(state_dict)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _trainable(self):
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def _register_hooks(self):
        if self._groups is not None:
            params = self._trainable()
            # Every rank must form the same groups: order parameters as rank 0 names them.
            order = broadcast_object(
                [self._parameter_names.get(p) for p in params],
                root_rank=0,
                name="DistributedOptimizer.order",
                process_set=self.process_set,
            )
            position = {name: i for i, name in enumerate(order)}
            params.sort(key=lambda p: position.get(self._parameter_names.get(p), len(position)))
            for group in policy.form_groups(params, self._groups):
                for p in group:
                    self._p_to_group[p] = group
                self._group_counts[group] = 0
        for p in self._trainable():
            self._requires_update.add(p)
            self._hook_refs.append(register_grad_ready_hook(p, self._make_hook(p)))

    def _scale_factors(self):
        return gradient_scale_factors(self.op, self.gradient_predivide_factor)

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Not used in this backward here, maybe used on other ranks: send zeros.
            p.grad = torch.zeros_like(p)
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return mpi_ops.sparse_allreduce_async(
                    tensor, name=name, op=self.op, process_set=self.process_set
                ), None
            tensor = tensor.to_dense()
        prescale, postscale = self._scale_factors()
        if self._stateful_compression():
            if not hasattr(p, "hvd_process_set"):
                pending = self._compression.start(
                    name, tensor, self.op, prescale, postscale, self.process_set
                )
                if pending is not None:  # a callable handle (mpi_ops.synchronize calls it)
                    return pending, None
            compressed, ctx = tensor, None  # this one goes uncompressed
        else:
            compressed, ctx = self._compression.compress(tensor)
        if hasattr(p, "hvd_process_set"):
            return self._own_set_allreduce_async(p, name, compressed, prescale, postscale), ctx
        handle = mpi_ops.allreduce_async_(
            compressed,
            name=name,
            op=self.op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=self.process_set,
        )
        return handle, ctx

    def _own_set_allreduce_async(self, p, name, tensor, prescale, postscale):
        """A parameter marked `p.hvd_process_set` (MoE experts: hvdlite/torch/parallel/moe/layer.py)
        is replicated only over that set (None: this rank alone), and its gradient already
        sums the contributions of the optimizer's other ranks (through the all-to-all), so it
        is reduced over its own set only; Average divides by the optimizer set's size."""
        own = p.hvd_process_set
        if self.op not in (dtypes.Average, dtypes.Sum):
            raise exceptions.NotSupportedError(
                "parameters with their own hvd_process_set need op Average or Sum"
            )
        if self.op == dtypes.Average:
            postscale *= (own.size() if own is not None else 1) / self.process_set.size()
        if own is None:
            scale = prescale * postscale
            return lambda: tensor.mul_(scale)
        return mpi_ops.allreduce_async_(
            tensor,
            name=name,
            op=self.op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=own,
        )

    def _grouped_allreduce_grad_async(self, group):
        if any(hasattr(p, "hvd_process_set") for p in group):
            raise exceptions.NotSupportedError(
                "groups= with parameters that have their own hvd_process_set (MoE experts)"
            )
        for p in group:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in group])
        prescale, postscale = self._scale_factors()
        handle = mpi_ops.grouped_allreduce_async_(
            list(compressed),
            name=self._parameter_names.get(group[0]),
            op=self.op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=self.process_set,
        )
        return handle, ctxs

    def _make_hook(self, p):
        def hook():
            if self._allreduce_delay[p] <= 0:  # already submitted since the last step()
                raise exceptions.CallOrderError(policy.TOO_MANY_BACKWARD_PASSES)
            assert not p.grad.requires_grad
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] > 0:
                self._handles[p] = (None, None)
            elif self._groups is None:
                self._handles[p] = self._allreduce_grad_async(p)
            else:
                self._group_ready(p)

        return hook

    def _group_ready(self, p):
        group = self._p_to_group[p]
        self._group_counts[group] += 1
        if self._group_counts[group] < len(group):
            self._handles[p] = (None, None)
            return
        self._handles[group] = self._grouped_allreduce_grad_async(group)
        for member in group:
            self._handles.pop(member, None)
        self._group_counts[group] = 0

    def _submit_missing(self):
        """Submits what backward did not: parameters whose hook never fired, or
        fired fewer than backward_passes_per_step times."""
        submitted: set[torch.Tensor] = set()
        for key, (handle, _) in self._handles.items():
            if handle is not None:
                submitted.update(key if isinstance(key, tuple) else (key,))
        for key in list(self._handles):
            if not isinstance(key, tuple) and self._handles[key][0] is None:
                del self._handles[key]
        if self._groups is not None:
            for group in self._group_counts:
                if not submitted.intersection(group):
                    self._handles[group] = self._grouped_allreduce_grad_async(group)
                    self._group_counts[group] = 0
        else:
            for p in sorted(self._requires_update - submitted, key=lambda q: self._parameter_names[q]):
                self._handles[p] = self._allreduce_grad_async(p)

    def synchronize(self):
        """Waits for every gradient allreduce and writes the results into p.grad."""
        if not self.process_set.included():
            self._synchronized = True
            return
        self._submit_missing()
        for handle, _ in self._handles.values():
            advance = getattr(handle, "advance", None)  # a stateful compressor's middle stage
            if advance is not None:
                advance()
        for key, (handle, ctx) in self._handles.items():
            if isinstance(key, tuple):
                for p, output, member_ctx in zip(key, mpi_ops.synchronize(handle), ctx):
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    self._set_grad(p, self._compression.decompress(output, member_ctx))
            else:
                output = mpi_ops.synchronize(handle)
                self._allreduce_delay[key] = self.backward_passes_per_step
                self._set_grad(key, self._compression.decompress(output, ctx))
        self._handles.clear()
        self._synchronized = True

    @staticmethod
    def _set_grad(p, value):
        if value is p.grad:
            return
        if p.grad.is_sparse:
            p.grad = value if value.is_sparse else value.to_sparse()
        else:
            with torch.no_grad():
                p.grad.copy_(value)

    @contextmanager
    def skip_synchronize(self):
        """Inside this context step() does not synchronize (call synchronize() first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(policy.STEP_AFTER_SYNCHRONIZE, stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)


def _check_stateful(compression, op, groups):
    """A stateful compressor (Compression.powersgd, .topk, .sign) reduces per gradient with
    op Average or Sum."""
    check_reduction(op, "every gradient")
    if groups is not None:
        raise exceptions.NotSupportedError(
            "groups= (or num_groups=) with %r: stateful compressors send each gradient through"
            " their own collectives; drop groups=" % (compression,)
        )


def DistributedOptimizer(
    optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step=1,
    op=dtypes.Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    sparse_as_dense=False,
    process_set=global_process_set,
):
    """Wraps `optimizer` so that gradients are averaged (op) across the ranks of
    `process_set` before each step. Arguments as in Horovod:

    named_parameters: model.named_parameters(), so allreduces carry names;
    compression: Compression.none, .fp16, .bf16, or a stateful compressor
    (Compression.powersgd(), .topk(), .sign(): docs/compression.md); backward_passes_per_step: local
    accumulation steps before an allreduce; op: Average, Sum or Adasum;
    gradient_predivide_factor: divide before the sum and multiply after
    (op=Average only); groups (num_groups is its deprecated name): an int to
    allreduce gradients in that many groups, or a list of lists of params;
    sparse_as_dense: allreduce sparse gradients as dense tensors."""
    from hvdlite.common.basics import size

    check_predivide(op, gradient_predivide_factor)
    groups = policy.resolve_groups(num_groups, groups)
    if op != dtypes.Adasum or size() == 1:
        return wrap(
            optimizer,
            _DistributedOptimizer,
            named_parameters,
            compression,
            backward_passes_per_step,
            op,
            gradient_predivide_factor,
            groups,
            sparse_as_dense,
            process_set,
        )
    if process_set is not global_process_set and process_set.process_set_id != 0:
        raise exceptions.NotSupportedError("Adasum does not support non-global process sets yet.")
    if getattr(compression, "stateful", False):
        raise exceptions.NotSupportedError(
            "op=Adasum with %r: use Compression.none or .fp16" % (compression,)
        )
    return wrap(
        optimizer, _DistributedAdasumOptimizer, named_parameters, compression, backward_passes_per_step
    )
