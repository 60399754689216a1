"""ZeRO's flat-buffer layout and its sharding groups (used by the rest of hvdlite.torch.parallel.zero).

A *bucket* is an ordered list of parameters of one optimizer param group, laid out back to
back in one flat fp32 buffer padded to a multiple of the shard count S. Member i (0-based) of
a shard group owns elements [i * shard_numel, (i + 1) * shard_numel) of every bucket. The
layout depends only on the parameters' registration order, shapes and S, so every rank
computes the same one without talking.

Sharding groups: the `process_set` of n ranks is cut into n / k groups of k consecutive
ranks (k = shard_size, default n). Gradients are reduce-scattered (Average) inside a group
and, when there are several groups, allreduced (Average) across the k replica sets (member i
of every group), which is the global average because every group has the same size.
"""

import dataclasses

import torch

from hvdlite.common import exceptions
from hvdlite.common.objects import allgather_object
from hvdlite.common.process_sets import ProcessSet, add_process_set, global_process_set
from hvdlite.common.topology import rank as global_rank

DEFAULT_BUCKET_NUMEL = 16 * 1024 * 1024 // 4  # 16 MiB of fp32 per bucket (stages 1 and 2)


@dataclasses.dataclass
class Slot:
    """Where one parameter lives in its bucket's flat buffer."""

    name: str
    param: torch.nn.Parameter
    offset: int
    numel: int
    shape: tuple[int, ...]


@dataclasses.dataclass
class Bucket:
    index: int
    group: int  # index of the optimizer param group
    slots: list[Slot]
    numel: int  # unpadded
    shard_numel: int
    shards: int  # the shard count S

    @property
    def padded_numel(self):
        return self.shard_numel * self.shards

    def shard_range(self, member):
        """[start, end) of `member`'s shard in the padded flat buffer."""
        return member * self.shard_numel, (member + 1) * self.shard_numel


def _close(slots, group, shards, buckets):
    if not slots:
        return
    numel = sum(s.numel for s in slots)
    shard = max(1, -(-numel // shards))
    buckets.append(Bucket(len(buckets), group, list(slots), numel, shard, shards))
    slots.clear()


def plan_buckets(entries, shards, bucket_numel=DEFAULT_BUCKET_NUMEL, split_keys=None):
    """Buckets for `entries` = [(name, param, group index)] in registration order. A new bucket
    starts when the group changes, when the next parameter would pass bucket_numel, or (stage
    3) when split_keys[i] differs from the previous parameter's key (its owning module)."""
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    offset = 0
    prev_group, prev_key = None, None
    for i, (name, p, group) in enumerate(entries):
        key = split_keys[i] if split_keys is not None else None
        n = p.numel()
        if slots and (group != prev_group or key != prev_key or offset + n > bucket_numel):
            _close(slots, prev_group, shards, buckets)
            offset = 0
        slots.append(Slot(name, p, offset, n, tuple(p.shape)))
        offset += n
        prev_group, prev_key = group, key
    _close(slots, prev_group, shards, buckets)
    return buckets


def describe(buckets):
    """The JSON-able layout of `buckets` (the checkpoint metadata's)."""
    return [
        {
            "group": b.group,
            "numel": b.numel,
            "shard_numel": b.shard_numel,
            "slots": [
                {"name": s.name, "offset": s.offset, "numel": s.numel, "shape": list(s.shape)}
                for s in b.slots
            ],
        }
        for b in buckets
    ]


# ---- sharding groups ---------------------------------------------------------------------

# Registered hybrid sets by member ranks, so that several ZeroOptimizers share them. Filled in
# the same order on every rank because construction is collective.
_SETS: dict[tuple[int, ...], ProcessSet] = {}


def _registered(ranks):
    ranks = tuple(ranks)
    if ranks not in _SETS:
        _SETS[ranks] = add_process_set(ProcessSet(list(ranks)), allow_duplicate=True)
    return _SETS[ranks]


def _cut(ranks, k):
    groups = [ranks[i : i + k] for i in range(0, len(ranks), k)]
    replicas = [ranks[j::k] for j in range(k)]
    return groups, replicas


class ShardGroups:
    """This rank's shard group (reduce-scatter / allgather) and replica group (allreduce),
    each None when it has a single member (no collective needed).

    Construction is collective over the whole job when shard_size < the set's size: the
    sub-sets of every rank's process_set are registered on every rank in one order."""

    def __init__(self, process_set, shard_size):
        self.process_set = process_set if process_set is not None else global_process_set
        ranks = list(self.process_set.ranks)
        if not self.process_set.included():
            raise exceptions.InvalidArgumentError(
                "ZeroOptimizer: rank %d is not in process_set %r" % (global_rank(), ranks)
            )
        n = len(ranks)
        k = n if shard_size is None else int(shard_size)
        if k < 1 or n % k:
            raise exceptions.InvalidArgumentError(
                "ZeroOptimizer: shard_size=%r must divide the process set's size %d" % (shard_size, n)
            )
        self.size, self.shard_count, self.replicas = n, k, n // k
        me = ranks.index(global_rank())
        self.member = me % k  # index inside the shard group
        self.group_index = me // k
        self.shard_set = self.process_set if k == n else None
        self.replica_set = None
        if 1 < k < n or (k == 1 and n > 1):
            self._register_hybrid(ranks, k)

    def _register_hybrid(self, ranks, k):
        # Every rank brings its own (process_set, k); register all distinct groups everywhere.
        plans = allgather_object((ranks, k), name="zero.shard_groups")
        wanted = []
        for r, kk in plans:
            groups, replicas = _cut(list(r), kk)
            for g in groups + replicas:
                if len(g) > 1 and tuple(g) not in wanted:
                    wanted.append(tuple(g))
        for g in wanted:
            _registered(g)
        groups, replicas = _cut(ranks, k)
        mine_g, mine_r = groups[self.group_index], replicas[self.member]
        self.shard_set = _SETS[tuple(mine_g)] if len(mine_g) > 1 else None
        self.replica_set = _SETS[tuple(mine_r)] if len(mine_r) > 1 else None

    def layout(self):
        return {"size": self.size, "shard_count": self.shard_count, "replicas": self.replicas}
