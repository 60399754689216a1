"""Buddy copies of a mesh rank's coordinate shard (MeshState(buddies=...), state.py): what lets a
replacement worker take a coordinate no survivor holds (dp is 1, or every replica was lost).

commit(): this rank's modules' and optimizers' state_dicts, packed as one flat byte copy
(shard_copy.py) into hvdlite/torch/elastic/buddy.py's BuddyCopies over every rank of the job: two
own copies (the last two commits) and a copy of one peer's shard, its buddy's, placed on another
host where there is one (mapped from /dev/shm where the ranks share it, else sent). The copies
of all ranks have one size, agreed per commit (one Max allreduce of two numbers): the largest
shard, with 1/8 slack so that it rarely grows. Commits are skipped (nothing packed, no copy
exchanged) while some rank's optimizer has no state yet (before its first step): the state that
appears with it would change the copy's size, and a size change drops the older copies.

fetch(): after the job re-formed, every member receives the copy of the old shard the plan gives
it (survivors their own, a replacement its lost coordinate's, from the buddy) at the newest
commit all of them have a copy of; the plain values (step, ...) of that commit come from the
commit's history (the last two commits). Threading: the training thread; collective over the job.
"""

import copy

import torch

from hvdlite.common import exceptions
from hvdlite.common.dtypes import Max
from hvdlite.common.process_sets import global_process_set
from hvdlite.common.topology import rank, size
from hvdlite.torch import mpi_ops
from hvdlite.torch.elastic.buddy import BuddyCopies
from hvdlite.torch.parallel.mesh import shard_copy


class MeshCopies:
    """This rank's buddy copies: `copies` (BuddyCopies of flat uint8 shards), the agreed size and
    the plain values of the last two commits by version."""

    def __init__(self, overlap=True):
        self.copies = BuddyCopies(overlap=overlap)
        self.capacity = 0  # bytes of every rank's copy (agreed)
        self.history: dict[int, dict[str, object]] = {}  # commit version -> the plain values saved with it

    def commit(self, states, plain, complete):
        """Keeps `states` ({key: state_dict}: this rank's modules and optimizers) and `plain` (the
        plain values, already copied) as the next commit, unless some rank is not `complete`
        (an optimizer without state). Collective over the job."""
        self.copies.settle(raise_errors=True)
        header, tensors, data = shard_copy.encode(states)
        need = shard_copy.size_of(header, data)
        agreed = mpi_ops.allreduce_(
            torch.tensor([need, 0 if complete else 1], dtype=torch.int64), op=Max, name="mesh_state.copy_size"
        ).tolist()
        if agreed[1]:
            return False
        if agreed[0] > self.capacity:
            self.capacity = -(-(agreed[0] + agreed[0] // 8) // 4096) * 4096
        version = self.copies.version + 1
        self.history[version] = plain
        for old in [v for v in self.history if v < version - 1]:
            del self.history[old]
        self.copies.commit(shard_copy.parts(header, tensors, self.capacity), global_process_set)
        return True

    def fetch(self, assignment):
        """(version, this rank's copy) for `assignment` = {new rank: the old rank (position) whose
        shard it takes}, every rank of the new job named. Collective: one allgather_object, one
        alltoall; ShardsLostError when some assigned shard has no copy left."""
        me, m = rank(), size()
        plan = self.copies.recover(global_process_set, needed=sorted(set(assignment.values())))
        held = plan.held()
        parts, splits = [], [0] * m
        for k in range(m):
            j = assignment[k]
            if j in held and plan.source[j] == plan.me:
                parts.append(held[j])
                splits[k] = held[j].numel()
        send = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
        got, _ = mpi_ops.synchronize(
            mpi_ops.alltoall_async(
                send, splits=splits, name="mesh_state.fetch", process_set=global_process_set
            )
        )
        if got.numel() == 0:
            raise exceptions.ShardsLostError(
                "rank %d received no copy of old rank %d's shard (commit %d)"
                % (me, assignment[me], plan.version)
            )
        return plan.version, got

    def newest_own(self):
        """(version, this rank's own copy) of its last packed commit."""
        c = self.copies
        version = max(c.own_versions)
        return version, c.own_copy(version)

    def plain_of(self, version):
        """The plain values committed with `version`, or None (a replacement worker has none)."""
        saved = self.history.get(version)
        return copy.deepcopy(saved) if saved is not None else None

    def forget(self):
        """Drops the old world's copies: the next commit places buddies over the new job."""
        self.copies.forget_placement()
        self.history.clear()
