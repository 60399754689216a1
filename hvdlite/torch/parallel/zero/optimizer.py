"""ZeroOptimizer: ZeRO stages 1-3 over hvdlite's public collectives.

    opt = hvd.ZeroOptimizer(torch.optim.AdamW(model.parameters()), model, stage=2)
    loss.backward(); opt.step(); opt.zero_grad()

Every rank keeps, per bucket (hvdlite.torch.parallel.zero.shard), an fp32 *master shard*: an
nn.Parameter of shard_numel elements that the wrapped optimizer updates, so its state is
shard-sized (stage 1). Gradients are reduce-scattered bucket by bucket as backward produces
them (a post-accumulate-grad hook per parameter); stage 2 and 3 drop the full gradients once
their bucket is submitted. After the update each shard is allgathered inside its shard group
into the parameters (stages 1, 2) or kept until the next forward gathers it (stage 3,
hvdlite.torch.parallel.zero.stage3). Every shard's update is computed by its owner alone, so
all ranks hold bitwise-identical parameters.

No hangs from unused parameters: a bucket whose gradients did not all arrive during backward
is reduce-scattered at step() with zeros for the missing ones, so every rank submits every
bucket's collectives, under fixed names, once per step. Construction is collective over the
process set (and over the whole job when shard_size splits it).
"""

import collections
import itertools
import math
import weakref

import torch

from hvdlite.common import dtypes, exceptions
from hvdlite.common.objects import broadcast_object
from hvdlite.torch import mpi_ops
from hvdlite.torch.parallel.zero import shard as zero_shard
from hvdlite.torch.parallel.zero.stage3 import Stage3Gatherer

# torch.optim classes whose update and state are elementwise per parameter element.
_ELEMENTWISE = (
    "SGD",
    "Adam",
    "AdamW",
    "Adamax",
    "Adagrad",
    "RMSprop",
    "Adadelta",
    "NAdam",
    "RAdam",
    "ASGD",
    "Rprop",
)
_UIDS = itertools.count()
# model -> its ZeroOptimizer (full_state_dict / checkpoints find it from the model).
OWNERS: "weakref.WeakKeyDictionary[torch.nn.Module, ZeroOptimizer]" = weakref.WeakKeyDictionary()


def _check_optimizer(optimizer):
    cls = type(optimizer)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise exceptions.InvalidArgumentError("ZeroOptimizer wraps a torch.optim.Optimizer, got %r" % cls)
    if cls.__module__.startswith("torch.optim") and cls.__name__ not in _ELEMENTWISE:
        raise exceptions.InvalidArgumentError(
            "ZeroOptimizer cannot shard %s: its update is not elementwise per parameter element (it "
            "needs whole tensors, closures or factored state). Supported torch.optim classes: %s"
            % (cls.__name__, ", ".join(_ELEMENTWISE))
        )


def check_state_elementwise(optimizer):
    """Raises when a state tensor is neither a scalar nor shaped like its parameter (e.g. the
    factored row/column statistics of Adafactor-like optimizers)."""
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.numel() > 1 and value.shape != p.shape:
                raise exceptions.InvalidArgumentError(
                    "ZeroOptimizer: %s keeps state %r of shape %s for a parameter of shape %s; only "
                    "elementwise optimizers can be sharded"
                    % (type(optimizer).__name__, key, tuple(value.shape), tuple(p.shape))
                )


def _owner_module_names(model):
    """{param id: name of the first module that registers it directly}."""
    owners: dict[int, str] = {}
    for mname, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), mname)
    return owners


class ZeroOptimizer(torch.optim.Optimizer):
    """Shards `optimizer` (elementwise: SGD, Adam, AdamW, ...) of `model` across `process_set`.

    stage: 1 shards optimizer state (and its fp32 master), 2 also gradients, 3 also
    parameters. shard_size: shard inside groups of this many consecutive ranks of the set and
    replicate across groups (hybrid). mixed_precision=torch.bfloat16 keeps the model's
    parameters in bf16 for compute and fp32 masters, fp32 gradient reduction. bucket_numel:
    elements per bucket (stages 1, 2; stage 3 buckets one module's parameters). The
    parameters of `optimizer` must be parameters of `model`."""

    def __init__(
        self,
        optimizer,
        model,
        stage=1,
        process_set=None,
        shard_size=None,
        backward_passes_per_step=1,
        mixed_precision=None,
        bucket_numel=None,
    ):
        _check_optimizer(optimizer)
        if stage not in (1, 2, 3):
            raise exceptions.InvalidArgumentError("ZeroOptimizer: stage must be 1, 2 or 3, got %r" % (stage,))
        if int(backward_passes_per_step) < 1:
            raise exceptions.InvalidArgumentError("backward_passes_per_step must be >= 1")
        if mixed_precision not in (None, torch.bfloat16, torch.float16, torch.float32):
            raise exceptions.InvalidArgumentError("mixed_precision must be None or a torch float dtype")
        self.stage = stage
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.compute_dtype = None if mixed_precision == torch.float32 else mixed_precision
        self.groups = zero_shard.ShardGroups(process_set, shard_size)
        self.process_set = self.groups.process_set
        self.prefix = "zero%d" % next(_UIDS)
        self._inner = optimizer
        self.model = model
        self.buckets = self._plan(optimizer, model, bucket_numel)
        self._sync_initial_parameters()
        self._flat_params = {}  # stages 1, 2: bucket -> flat buffer the parameters are views of
        self._grad_flat = {}  # stage 1, fp32: bucket -> flat buffer the .grad are views of
        self.master = [self._make_master(b) for b in self.buckets]
        self._install_shards(optimizer)
        super().__init__([{"params": list(self.master)}], dict(optimizer.defaults))
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self._checked_state = False
        self._steps = 0
        self._reset_step_state()
        self._hooks = []
        self._slot_bucket = {id(s.param): b for b in self.buckets for s in b.slots}
        self._attach_grad_views()
        self.stage3 = None
        if stage == 3:
            self.stage3 = Stage3Gatherer(self)
        self._register_grad_hooks()
        OWNERS[model] = self

    # ---- construction -------------------------------------------------------------------

    def _plan(self, optimizer, model, bucket_numel):
        group_of = {id(p): gi for gi, g in enumerate(optimizer.param_groups) for p in g["params"]}
        named = list(model.named_parameters())
        known = {id(p) for _, p in named}
        stray = [gi for pid, gi in group_of.items() if pid not in known]
        if stray:
            raise exceptions.InvalidArgumentError(
                "ZeroOptimizer: the optimizer has %d parameter(s) (param groups %s) that are not "
                "parameters of the model" % (len(stray), sorted(set(stray)))
            )
        entries = [(n, p, group_of[id(p)]) for n, p in named if id(p) in group_of]
        for n, p, _ in entries:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise exceptions.InvalidArgumentError(
                    "ZeroOptimizer shards float32 CPU parameters (mixed_precision= gives bf16 compute); "
                    "%s is %s on %s" % (n, p.dtype, p.device)
                )
        split_keys = None
        if self.stage == 3:
            owners = _owner_module_names(model)
            split_keys = [owners[id(p)] for _, p, _ in entries]
        limit = bucket_numel or (1 << 62 if self.stage == 3 else zero_shard.DEFAULT_BUCKET_NUMEL)
        return zero_shard.plan_buckets(entries, self.groups.shard_count, limit, split_keys)

    def _sync_initial_parameters(self):
        """Every replica starts from the first rank of the process set's parameters."""
        if self.groups.size == 1:
            return
        root = self.process_set.ranks[0]
        handles = [
            mpi_ops.broadcast_async_(
                s.param.data, root, name="%s.init.%s" % (self.prefix, s.name), process_set=self.process_set
            )
            for b in self.buckets
            for s in b.slots
        ]
        for h in handles:
            mpi_ops.synchronize(h)

    def _make_master(self, bucket):
        """This rank's fp32 master shard of `bucket`. Stages 1, 2: the parameters become views
        of one flat buffer per bucket, and in fp32 the master shard is a view of it too (no
        second copy; the optimizer updates this rank's slice of the parameters in place)."""
        flat = torch.zeros(bucket.padded_numel, dtype=torch.float32)
        for s in bucket.slots:
            flat[s.offset : s.offset + s.numel].copy_(s.param.detach().reshape(-1))
        start, end = bucket.shard_range(self.groups.member)
        if self.stage == 3:
            return torch.nn.Parameter(flat[start:end].clone())
        if self.compute_dtype is None:
            master = torch.nn.Parameter(flat[start:end])
        else:
            master = torch.nn.Parameter(flat[start:end].clone())
            flat = flat.to(self.compute_dtype)
        self._flat_params[bucket.index] = flat
        for s in bucket.slots:
            s.param.data = flat[s.offset : s.offset + s.numel].view(s.shape)
        return master

    def _install_shards(self, optimizer):
        """The wrapped optimizer's groups now hold the master shards, hyperparameters kept."""
        new_groups = []
        for gi, group in enumerate(optimizer.param_groups):
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [self.master[b.index] for b in self.buckets if b.group == gi]
            new_groups.append(g)
        optimizer.param_groups = new_groups
        optimizer.state = collections.defaultdict(dict)

    def _attach_grad_views(self, buckets=None):
        """Stage 1 in fp32: every .grad is a view of its bucket's flat gradient buffer
        (autograd accumulates into it in place), which is reduce-scattered without a copy."""
        if self.stage != 1 or self.compute_dtype is not None:
            return
        for b in self.buckets if buckets is None else buckets:
            flat = self._grad_flat.get(b.index)
            if flat is None:
                flat = self._grad_flat[b.index] = torch.zeros(b.padded_numel, dtype=torch.float32)
            for s in b.slots:
                view = flat[s.offset : s.offset + s.numel]
                g = s.param.grad
                if g is None:
                    view.zero_()
                elif g.data_ptr() != view.data_ptr():
                    view.copy_(g.reshape(-1))
                else:
                    continue
                s.param.grad = view.view(s.shape)

    def _register_grad_hooks(self):
        for b in self.buckets:
            for s in b.slots:
                if s.param.requires_grad:
                    self._hooks.append(s.param.register_post_accumulate_grad_hook(self._grad_ready))

    def _reset_step_state(self):
        self._counts = [0] * len(self.buckets)
        self._launched = set()
        self._in_flight = {}  # bucket -> reducescatter handle (it keeps the padded gradient alive)
        self._shards = {}  # bucket -> this rank's reduced gradient shard (before replica averaging)
        self._reduced = False

    def _expected(self, bucket):
        return self.backward_passes_per_step * sum(1 for s in bucket.slots if s.param.requires_grad)

    # ---- gradients ----------------------------------------------------------------------

    def _grad_ready(self, p):
        """Post-accumulate-grad hook (autograd's thread of this backward)."""
        b = self._slot_bucket[id(p)]
        if b.index in self._launched:
            raise exceptions.CallOrderError(
                "ZeroOptimizer: a gradient of %s arrived after its bucket was reduced; call step() "
                "after every %d backward pass(es) (backward_passes_per_step)"
                % (b.slots[0].name, self.backward_passes_per_step)
            )
        self._counts[b.index] += 1
        if self._counts[b.index] >= self._expected(b):
            self._launch(b)

    def _bucket_gradient(self, bucket):
        """The padded fp32 gradient of `bucket` (zeros where a gradient is missing); stages 2
        and 3 drop the parameters' full gradients."""
        if bucket.index in self._grad_flat:
            self._attach_grad_views([bucket])  # a .grad replaced or None: copied or zeroed into it
            return self._grad_flat[bucket.index]
        flat = torch.zeros(bucket.padded_numel, dtype=torch.float32)
        for s in bucket.slots:
            if s.param.grad is not None:
                flat[s.offset : s.offset + s.numel].copy_(s.param.grad.reshape(-1))
                if self.stage >= 2:
                    s.param.grad = None
        return flat

    def _launch(self, bucket):
        """Submits the reduce-scatter of `bucket`."""
        flat = self._bucket_gradient(bucket)
        self._launched.add(bucket.index)
        if self.groups.shard_set is None:
            self._shards[bucket.index] = flat
        else:
            self._in_flight[bucket.index] = mpi_ops.reducescatter_async(
                flat,
                name="%s.rs.%d" % (self.prefix, bucket.index),
                op=dtypes.Average,
                process_set=self.groups.shard_set,
            )
        if self.stage3 is not None:
            self.stage3.grads_done(bucket.index)
        self._collect(block=False)

    def _collect(self, block):
        """Moves finished reduce-scatters' shards out of flight (freeing their padded input)."""
        for index, handle in list(self._in_flight.items()):
            if block or mpi_ops.poll(handle):
                self._shards[index] = mpi_ops.synchronize(handle)
                del self._in_flight[index]

    def _finish_reduction(self):
        """Reduces every bucket not yet reduced and sets the master shards' gradients."""
        if self._reduced:
            return
        if self.stage3 is not None:
            self.stage3.end_backward()
        for b in self.buckets:
            if b.index not in self._launched:
                self._launch(b)
        self._collect(block=True)
        shards = [self._shards[b.index] for b in self.buckets]
        if self.groups.replica_set is not None:
            handles = [
                mpi_ops.allreduce_async_(
                    shard,
                    name="%s.ar.%d" % (self.prefix, i),
                    op=dtypes.Average,
                    process_set=self.groups.replica_set,
                )
                for i, shard in enumerate(shards)
            ]
            for h in handles:
                mpi_ops.synchronize(h)
        for master, shard in zip(self.master, shards):
            master.grad = shard
        self._shards.clear()
        self._reduced = True

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Scales the (reduced, sharded) gradients so that their global norm is at most
        max_norm, as `torch.nn.utils.clip_grad_norm_` on the full gradients; returns the norm
        before clipping. Collective: call it on every rank, between backward and step()."""
        self._finish_reduction()
        grads = [m.grad for m in self.master]
        norm_type = float(norm_type)
        if norm_type == math.inf:
            local = torch.stack([g.abs().max() for g in grads]).max().reshape(1)
            op = dtypes.Max
        elif norm_type == 2.0:
            local = torch.stack([g.double().pow(2).sum() for g in grads]).sum().reshape(1)
            op = dtypes.Sum
        else:
            raise exceptions.InvalidArgumentError("clip_grad_norm_: norm_type must be 2 or inf")
        if self.groups.shard_set is not None:
            local = mpi_ops.allreduce_(
                local, name="%s.norm" % self.prefix, op=op, process_set=self.groups.shard_set
            )
        total = local[0] if op == dtypes.Max else local[0].sqrt()
        total = total.float()
        coef = float(max_norm) / (float(total) + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
        return total

    # ---- step ---------------------------------------------------------------------------

    def step(self, closure=None):
        """Reduces the gradients, updates this rank's shards, then shares them. Collective."""
        if closure is not None:
            raise exceptions.InvalidArgumentError("ZeroOptimizer.step does not take a closure")
        self._finish_reduction()
        self._inner.step()
        if not self._checked_state:
            check_state_elementwise(self._inner)
            self._checked_state = True
        if self.stage3 is None:
            self.publish()
        else:
            self.stage3.after_step(self._steps)
        self._steps += 1
        self._reset_step_state()

    def gather_bucket_async(self, bucket, name, fp32=False):
        """Starts allgathering `bucket`'s master shards (cast to the compute dtype unless
        fp32) inside the shard group; returns a callable giving the padded flat tensor."""
        src = self.master[bucket.index].detach()
        if self.compute_dtype is not None and not fp32:
            src = src.to(self.compute_dtype)
        if self.groups.shard_set is None:
            return lambda: src
        handle = mpi_ops.allgather_async(src, name=name, process_set=self.groups.shard_set)
        return lambda: mpi_ops.synchronize(handle)

    def publish(self):
        """Stages 1, 2: allgathers every updated bucket into the model's parameters."""
        pending = [
            (b, self.gather_bucket_async(b, "%s.ag.%d" % (self.prefix, b.index))) for b in self.buckets
        ]
        with torch.no_grad():
            for b, wait in pending:
                full = wait()
                for s in b.slots:
                    s.param.data.copy_(full[s.offset : s.offset + s.numel].view(s.shape))

    def zero_grad(self, set_to_none=True):
        """Clears the gradients. Stage 1 in fp32 zeroes its flat gradient buffers instead of
        setting .grad to None (the .grad stay views of them, as DDP's gradient_as_bucket_view)."""
        for m in self.master:
            m.grad = None
        if self._grad_flat:
            for flat in self._grad_flat.values():
                flat.zero_()
            self._attach_grad_views()
            return
        for b in self.buckets:
            for s in b.slots:
                if s.param.grad is not None:
                    if set_to_none:
                        s.param.grad = None
                    else:
                        s.param.grad.zero_()

    def _finish_pending_for_checkpoint(self):
        if self._launched:
            raise exceptions.CallOrderError(
                "ZeroOptimizer: save_checkpoint between backward and step(); save after step()"
            )
        if self.stage3 is not None:
            self.stage3.end_backward()

    def _after_load(self):
        """New master values: share them (stages 1, 2) or let the next forward gather them."""
        if self.stage3 is None:
            self.publish()

    def memory_bytes(self):
        """Bytes this rank holds now, by kind: `params` (the model's parameter storages),
        `master` (fp32 master shards not sharing the parameters' storage), `grads` (the model's .grad plus reduced shards) and
        `optimizer_state` (the wrapped optimizer's state tensors)."""
        seen, params, grads = set(), 0, 0
        for b in self.buckets:
            for s in b.slots:
                storage = s.param.untyped_storage()
                if storage.data_ptr() not in seen or storage.nbytes() == 0:
                    seen.add(storage.data_ptr())
                    params += storage.nbytes()
                if s.param.grad is not None:
                    grads += s.param.grad.nbytes
        grads += sum(m.grad.nbytes for m in self.master if m.grad is not None)
        state = sum(v.nbytes for st in self._inner.state.values() for v in st.values() if torch.is_tensor(v))
        master = sum(m.nbytes for m in self.master if m.untyped_storage().data_ptr() not in seen)
        return {
            "params": params,
            "master": master,
            "grads": grads,
            "optimizer_state": state,
        }

    def state_dict(self):
        raise exceptions.NotSupportedError(
            "ZeroOptimizer holds shards: save with hvd.save_checkpoint(path, model, opt) instead"
        )

    def load_state_dict(self, state_dict):
        raise exceptions.NotSupportedError(
            "ZeroOptimizer holds shards: load with hvd.load_checkpoint(path, model, opt) instead"
        )

    def elastic_handler(self):
        """hvd.elastic.TorchState's handler of this optimizer (buddy copies of the shards)."""
        from hvdlite.torch.parallel.zero.elastic import ZeroHandler

        return ZeroHandler(self)

    def elastic_model_handler(self):
        from hvdlite.torch.parallel.zero.elastic import RestModelHandler

        return RestModelHandler(self.model, self)

    def schedule_from_root(self, traces):
        """Rank 0 of the process set's `traces` (stage 3 gather order), on every rank."""
        return broadcast_object(
            traces,
            root_rank=self.process_set.ranks[0],
            name="%s.trace" % self.prefix,
            process_set=self.process_set,
        )
