"""Elastic training with a ZeroOptimizer: the TorchState handler of its sharded state.

What is kept where (docs/elastic.md, "ZeRO"):
  - commit (save()): this rank's master shards and the elementwise optimizer state shards of
    every bucket, packed into one flat fp32 copy in host memory, and one peer's copy of the same
    (hvdlite/torch/elastic/buddy.py: a send and a receive per rank, left running while training
    goes on unless TorchState(..., buddy_overlap=False); where the ranks share /dev/shm the buddy
    maps the owner's packed copy instead and nothing is sent). The
    optimizer's scalar state (Adam's step) and the shard sizes are kept per commit version (the
    last two). Stage 3's parameters live only in the masters, so the masters are the whole model
    state ZeRO manages; the model's other entries (buffers, frozen parameters) are kept whole by
    RestModelHandler, as TorchState keeps a plain model.
  - after the job re-formed (reset(), collective over the new world): the survivors agree on the
    newest commit every old shard still has a copy of, the optimizer is re-planned for the new
    world size (same buckets, new shard sizes), and each rank fetches the element ranges of the
    old shards that make up its new ones (one alltoall) and installs them: its optimizer state
    then holds this rank's share of the new world and nothing else.
  - a shard with no surviving copy (its rank and its buddy lost together) raises
    ShardsLostError, which hvd.elastic.run does not retry, naming both ranks.

Requires the optimizer sharded over every rank (process_set None, shard_size None): the job's
size changes on re-form, and so does the shard count. Threading: the training thread.
"""

import copy

import torch

from hvdlite.common import exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch.elastic.buddy import BuddyCopies
from hvdlite.torch.functions import broadcast_parameters
from hvdlite.torch.parallel.zero.checkpoint_io import rest_and_keys
from hvdlite.torch.parallel.zero.shard import ShardGroups
from hvdlite.torch.parallel.zero.stage3 import _free

_KEEP_VERSIONS = 2  # the commit in progress and the one before


def _managed(z):
    return {id(s.param): s.name for b in z.buckets for s in b.slots}


def pack(z):
    """(tensors, meta) of this rank's shards: per bucket the master then each elementwise state
    key (sorted); meta per bucket = (keys, scalar state, shard_numel)."""
    tensors, meta = [], []
    for b in z.buckets:
        m = z.master[b.index]
        state = z._inner.state.get(m, {})
        keys = sorted(k for k, v in state.items() if torch.is_tensor(v) and v.shape == m.shape)
        for k in keys:
            if state[k].dtype != torch.float32:
                raise exceptions.NotSupportedError(
                    "elastic ZeroOptimizer: optimizer state %r of bucket %d is %s; buddy copies keep "
                    "float32 state only" % (k, b.index, state[k].dtype)
                )
        scalars = {
            k: (v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v))
            for k, v in state.items()
            if k not in keys
        }
        tensors.append(m.detach())
        tensors.extend(state[k].detach() for k in keys)
        meta.append((keys, scalars, b.shard_numel))
    return tensors, meta


def segments(buckets, meta, j, k):
    """[(bucket, row, lo, hi, a, b)]: elements [lo, hi) of a bucket's flat buffer that old shard j
    holds and new member k needs, found at [a, b) of j's packed copy; row 0 is the master, row
    r the r-th state key of meta. `buckets` carry the new shard sizes, meta the old ones."""
    out, off = [], 0
    for bucket, (keys, _, sh) in zip(buckets, meta):
        rows = 1 + len(keys)
        new = bucket.shard_numel
        lo = max(j * sh, k * new)
        hi = min((j + 1) * sh, (k + 1) * new, bucket.numel)
        if lo < hi:
            for r in range(rows):
                base = off + r * sh - j * sh
                out.append((bucket, r, lo, hi, base + lo, base + hi))
        off += rows * sh
    return out


def assemble(buckets, meta, pieces, me):
    """{bucket index: [master, state key...] new shards of member `me`} from `pieces` = {old
    shard j: the tensors of segments(buckets, meta, j, me), in order}; padding stays zero."""
    rows = {
        b.index: [torch.zeros(b.shard_numel, dtype=torch.float32) for _ in range(1 + len(meta[b.index][0]))]
        for b in buckets
    }
    for j, got in pieces.items():
        for (bucket, r, lo, hi, _, _), piece in zip(segments(buckets, meta, j, me), got):
            start = me * bucket.shard_numel
            rows[bucket.index][r][lo - start : hi - start].copy_(piece)
    return rows


def reform(z):
    """Re-plans `z` for the current world: same buckets and slots, shard count = the new size;
    drops every per-step and per-world buffer. The masters are left to install()."""
    if z.groups.replicas != 1 or z.process_set.process_set_id != 0:
        raise exceptions.NotSupportedError(
            "elastic ZeroOptimizer shards over every rank: build it with process_set=None, shard_size=None"
        )
    z.groups = ShardGroups(global_process_set, None)
    z.process_set = z.groups.process_set
    for b in z.buckets:
        b.shards = z.groups.shard_count
        b.shard_numel = max(1, -(-b.numel // b.shards))
    z._flat_params.clear()
    z._grad_flat.clear()
    z._reset_step_state()
    for b in z.buckets:
        for s in b.slots:
            s.param.grad = None
    for m in z.master:
        m.grad = None
    if z.stage3 is not None:
        g = z.stage3
        g.held.clear()
        g.issued.clear()
        g.repeats.clear()
        g.phase, g.ptr = "", 0
        dtype = z.compute_dtype
        for b in z.buckets:
            for s in b.slots:
                s.param.data = torch.empty(s.shape, dtype=dtype or torch.float32)
                _free(s.param)


def install(z, rows, meta):
    """Makes rows[b] ([master, state key...] new shards of bucket b) the optimizer's masters and
    state; stages 1, 2 share them into the parameters (a collective)."""
    masters = []
    for b in z.buckets:
        values = rows[b.index][0]
        if z.stage3 is not None:
            masters.append(torch.nn.Parameter(values))
            continue
        flat = torch.zeros(b.padded_numel, dtype=z.compute_dtype or torch.float32)
        start, end = b.shard_range(z.groups.member)
        if z.compute_dtype is None:
            flat[start:end].copy_(values)
            master = torch.nn.Parameter(flat[start:end])
        else:
            master = torch.nn.Parameter(values)
        z._flat_params[b.index] = flat
        for s in b.slots:
            s.param.data = flat[s.offset : s.offset + s.numel].view(s.shape)
        masters.append(master)
    z.master = masters
    for gi, group in enumerate(z._inner.param_groups):
        group["params"] = [masters[b.index] for b in z.buckets if b.group == gi]
    z._inner.state.clear()
    for b in z.buckets:
        keys, scalars, _ = meta[b.index]
        if keys or scalars:
            state = {k: (v.clone() if torch.is_tensor(v) else copy.deepcopy(v)) for k, v in scalars.items()}
            state.update({k: rows[b.index][1 + i] for i, k in enumerate(keys)})
            z._inner.state[masters[b.index]] = state
    z._attach_grad_views()
    if z.stage3 is None:
        z.publish()


class ZeroHandler:
    """TorchState's handler of a ZeroOptimizer (the interface of hvdlite/torch/elastic/state.py's
    _Handler, plus next_version and rebuild()). TorchState commits again right after rebuild():
    until then the copies are the old world's."""

    def __init__(self, z):
        if z.groups.replicas != 1 or z.process_set.process_set_id != 0:
            raise exceptions.NotSupportedError(
                "hvd.elastic.TorchState: the ZeroOptimizer must shard over every rank (process_set=None, "
                "shard_size=None); the job's size changes when it re-forms"
            )
        self.value = z
        self.copies = BuddyCopies(overlap=True)  # TorchState(..., buddy_overlap=False) turns it off
        self.meta = {}  # commit version -> pack() meta
        self.save()

    @property
    def next_version(self):
        return self.copies.version + 1

    def save(self):
        """Commits this rank's shards and exchanges them with its buddy. Collective."""
        z = self.value
        z._finish_pending_for_checkpoint()
        tensors, meta = pack(z)
        version = self.next_version
        self.meta[version] = meta
        for old in [v for v in self.meta if v <= version - _KEEP_VERSIONS]:
            del self.meta[old]
        self.copies.commit(tensors, z.process_set)

    def restore(self):
        """Waits for the last commit's exchange (it completed, or failed with the world: its buddy
        copy then counts as lost); reset() (after re-form) rebuilds the commit."""
        self.copies.settle()

    def set_value(self, value):
        raise exceptions.NotSupportedError("hvd.elastic.TorchState: a ZeroOptimizer cannot be replaced")

    def sync(self):
        """Nothing: after rebuild() every rank holds its own share, consistent by construction."""

    def recover_plan(self):
        """Which commit every shard survived in and who sends what (buddy.RecoveryPlan).
        Collective over the new world."""
        return self.copies.recover(global_process_set)

    def rebuild(self, plan):
        """Rebuilds commit plan.version, resharded to the current world. Collective."""
        z = self.value
        meta = self.meta.get(plan.version)
        if meta is None:
            raise exceptions.ShardsLostError(
                "elastic ZeroOptimizer: commit %d (the newest every shard survived in) is no longer "
                "kept on this rank" % plan.version
            )
        reform(z)
        me = plan.me
        pieces = plan.fetch(
            lambda j, k: [(a, b) for _, _, _, _, a, b in segments(z.buckets, meta, j, k)], global_process_set
        )
        install(z, assemble(z.buckets, meta, pieces, me), meta)
        self.copies.forget_placement()  # the next commit places buddies in the new world


class RestModelHandler:
    """TorchState's handler of a model trained with a ZeroOptimizer: keeps (and syncs) only the
    state_dict entries ZeRO does not manage; the managed ones are the optimizer's masters."""

    def __init__(self, model, z):
        self.value, self.z = model, z
        self.save()

    def save(self):
        rest, _ = rest_and_keys(self.value, _managed(self.z))
        self._saved = rest

    def restore(self):
        self.value.load_state_dict(self._saved, strict=False)

    def set_value(self, value):
        raise exceptions.NotSupportedError(
            "hvd.elastic.TorchState: a ZeroOptimizer's model cannot be replaced"
        )

    def sync(self):
        rest, _ = rest_and_keys(self.value, _managed(self.z))
        if rest:
            broadcast_parameters({k: v for k, v in self.value.state_dict().items() if k in rest}, root_rank=0)
