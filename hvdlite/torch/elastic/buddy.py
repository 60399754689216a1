"""Buddy copies: each rank of a process set keeps, in host memory, a copy of its own shard and of
ONE peer's shard (its buddy's, on another host where there is one), so that after ranks are lost
the survivors can rebuild every shard of the last commit without disk.

Reusable for any sharded state (ZeRO, hvdlite/torch/parallel/zero/elastic.py; a mesh job's dp=1
shards): the caller gives one flat 1-D tensor per rank (its shard, any length and dtype, equal
dtypes across the set) and later asks for element ranges of any old rank's shard.

    copies = BuddyCopies()
    copies.commit(flat, process_set)          # collective: ONE alltoall, one non-empty slot each way
    ... ranks die, the job re-forms ...
    plan = copies.recover(process_set)        # collective: one allgather_object of a small tuple
    pieces = plan.fetch(ranges, process_set)  # collective: one alltoall; {old rank: [tensors]}
    whole = plan.fetch_whole({new_rank: [old ranks]}, process_set)  # or whole shards, as they were

Placement: the set's ranks are ordered host by host (hosts in order of their lowest rank); the
holder of the shard at position i is position (i + s) mod n, with s the largest host's rank count
when that puts every copy on another host (the elastic driver drops a failed worker's host whole,
so a host-mate would die with it), else the shift putting the most copies off-host.

Versions: each copy carries the commit version it holds. Own copies alternate between two
buffers, so the last commit's stays while the next is packed; a buddy copy counts as lost from
the moment its exchange starts until it returned. Without overlap (one buddy buffer, received in
place by one alltoall) a barrier before the exchange makes the usual cut-short commit (a member
died before it, e.g. mid-step) leave every buddy copy intact; a member that dies during the
exchange itself may take with it the only complete copy of its shard of both versions. With
overlap the exchange is a send and a receive (point-to-point, outside the core's order of
collectives, so training's collectives run while it travels) into the older of two buddy
buffers, so the previous commit's buddy copy stays whole until the next one arrived, whenever a
member dies. recover() picks the newest version of which every old shard still has a copy and
raises ShardsLostError naming the owner and its buddy when some shard has none.

Shared memory: where every member sees the same /dev/shm (one machine; HVDLITE_BUDDY_SHARED_MEMORY
not 0), the own buffers are files there that each buddy maps (buddy_shm.py): the buddy copy is
the owner's packed copy itself, which outlives the owner's process, and nothing travels. The
commit is then the pack and one barrier; each buddy holds the owner's last two commits (the one
being packed reads version 0). Decided once per world (two small collectives); any member that
cannot create or map the files makes every member fall back to sending the copies.

Memory: two own copies and one buddy copy (two with overlap), reused from commit to commit (no
allocation, no page faults after the first); shared, the two own copies only. Threading: the
training thread; the core's background thread moves an overlapped exchange's bytes.
"""

import dataclasses
import socket
from typing import Any

import torch

from hvdlite.common import collectives, exceptions, ops, settings
from hvdlite.common.objects import allgather_object
from hvdlite.common.process_sets import global_process_set, resolve
from hvdlite.common.topology import rank as global_rank
from hvdlite.torch import mpi_ops, p2p_ops
from hvdlite.torch.buffers import TORCH
from hvdlite.torch.elastic.buddy_shm import SharedShard, name_prefix, share_key

CHECKPOINT_HINT = (
    "restart from the last disk checkpoint (hvd.save_checkpoint(path, model, opt) while training, "
    "hvd.load_checkpoint(path, model, opt) at start)"
)


def host_id():
    """This process's host as the launcher names it (HVDLITE_HOSTNAME), else the machine's."""
    return settings.get("HOSTNAME") or socket.gethostname()


def holders(hosts):
    """holder[i]: the position in the set keeping a copy of position i's shard; `hosts[i]` is the
    host of position i. Pure: every rank computes the same from the same list."""
    n = len(hosts)
    if n < 2:
        return list(range(n))
    first: dict[object, int] = {}
    for i, h in enumerate(hosts):
        first.setdefault(h, i)
    order = sorted(range(n), key=lambda i: (first[hosts[i]], i))  # host by host
    largest = max(sum(1 for h in hosts if h == x) for x in first)
    candidates = [largest] + [s for s in range(1, min(n, 9)) if s != largest and s < n]
    candidates = [s for s in candidates if 0 < s < n]

    def off_host(s):
        return sum(hosts[order[p]] != hosts[order[(p + s) % n]] for p in range(n))

    best = max(candidates, key=lambda s: (off_host(s), -candidates.index(s)))
    holder = [0] * n
    for p in range(n):
        holder[order[p]] = order[(p + best) % n]
    return holder


class BuddyCopies:
    """One rank's copies: its own shard (two buffers, the last two commits packed alternately)
    and its buddy's (one buffer received in place; two, alternating, with `overlap`), each with
    the commit version it holds.

    overlap=False: commit() returns once the buddy's copy arrived. overlap=True: commit() packs
    (the commit point), starts the exchange and returns; the core's background thread moves the
    data while training goes on. The next commit(), settle() and recover() first wait for it."""

    _instances = 0  # construction order: the same on every rank, names each one's exchange

    def __init__(self, overlap=False):
        BuddyCopies._instances += 1
        self.uid = BuddyCopies._instances
        self.overlap = overlap
        self.version = 0  # commits started
        self.own: list[torch.Tensor | None] = [None, None]  # this rank's shard, packed alternately
        self.own_versions = [0, 0]  # the version each holds (0: none)
        self.buddy: list[torch.Tensor | None] = [None, None]  # the buddy's shard (slot 1: overlap)
        self.buddy_versions = [0, 0]
        self.buddy_of = None  # the buddy's old position
        self.position, self.size, self.holder = None, 0, None
        self._hosts_key = None
        self._inflight = None  # (handle, buddy slot, version) of an exchange not yet waited for
        self._can_share = False  # every member maps its holder's /dev/shm (placement)
        self._shared = None  # (numel, dtype) the shared files hold; None: private buffers
        self._share_tried = None  # the (numel, dtype) _share() last ran for in this world
        self._own_files: list[SharedShard] = []  # by own slot, while shared
        self._buddy_files: list[SharedShard] = []  # the buddy's own files, mapped here

    def _placement(self, process_set):
        ranks = tuple(process_set.ranks)
        if self._hosts_key != ranks:
            self._drop_shared()
            got = allgather_object((host_id(), share_key()), name="buddy.hosts", process_set=process_set)
            self._hosts_key, self.holder = ranks, holders([h for h, _ in got])
            self.position, self.size = ranks.index(global_rank()), len(ranks)
            keys = [k for _, k in got]
            self._can_share = len(ranks) > 1 and all(k is not None and k == keys[0] for k in keys)
        return self.position, self.size, self.holder

    def forget_placement(self):
        """Drops every copy (the old world's) and makes the next commit() place buddies anew:
        call once the job re-formed and the old copies were used."""
        self.settle()
        self._drop_shared()
        self._hosts_key = None
        self.own, self.own_versions = [None, None], [0, 0]
        self.buddy, self.buddy_versions, self.buddy_of = [None, None], [0, 0], None

    def settle(self, raise_errors=False):
        """Waits for the exchange commit() left running, if any (bounded by the core's operation
        timeout; at once when the job was shut down: its handle is stale) and records its buddy
        copy. True when none was running or it completed; False when it failed (the copy counts
        as lost), or raises the failure with `raise_errors`."""
        if self._inflight is None:
            return True
        handles, slot, version = self._inflight
        self._inflight = None
        error, out = None, None
        for handle in handles:  # every one, even after one failed: the core may use the buffers
            try:
                got = mpi_ops.synchronize(handle)
                out = got if out is None else out
            except exceptions.HvdliteError as e:
                error = error or e
        if error is not None:
            if raise_errors:
                raise error
            return False
        self.buddy[slot], self.buddy_versions[slot] = out, version
        return True

    def commit(self, parts, process_set=None):
        """Keeps a copy of this rank's shard, `parts` (a 1-D tensor or a list of them, kept as
        their concatenation), and exchanges it with the buddies. Collective over `process_set`
        (default: every rank); blocks until the buddy's copy arrived, or with `overlap` only
        until the previous commit's did (raising its failure) and the new exchange started.

        Order: pack into the older own buffer (the newer, the last commit, stays); without
        overlap one barrier (every member packed and alive: a failure up to here leaves the one
        buddy copy intact); then the exchange into the (older) buddy buffer, which counts as lost
        until it returned."""
        process_set = process_set or global_process_set
        self.settle(raise_errors=True)
        parts = [t.detach().reshape(-1) for t in (parts if isinstance(parts, (list, tuple)) else [parts])]
        numel = sum(t.numel() for t in parts)
        pos, n, holder = self._placement(process_set)
        self.version += 1
        if self._can_share and self._share_tried != (numel, parts[0].dtype):
            self._share(numel, parts[0].dtype, holder.index(pos), process_set)
            self._share_tried = (numel, parts[0].dtype)  # once: where it failed, private buffers
        dest = self._pack(parts, numel)
        if n < 2:
            return
        if self._shared is not None:  # the buddy maps this copy: nothing travels
            mpi_ops.barrier(process_set)  # every member packed: the buddy copies hold `version`
            self.buddy_versions = [f.version for f in self._buddy_files]
            return
        if not self.overlap:
            mpi_ops.barrier(process_set)
        slot = 1 if self.overlap and self.buddy_versions[1] < self.buddy_versions[0] else 0
        self.buddy_versions[slot] = 0  # from here the buffer may be half written
        into = self.buddy[slot]
        if into is None or into.shape != dest.shape or into.dtype != dest.dtype:
            self.buddy[slot] = None
            into = self.buddy[slot] = torch.empty_like(dest)
        self.buddy_of = holder.index(pos)
        if self.overlap:
            handles = self._post_p2p(dest, into, holder[pos], process_set)
        else:
            handles = (self._post_alltoall(dest, into, holder[pos], n, process_set),)
        self._inflight = (handles, slot, self.version)
        if not self.overlap:
            self.settle(raise_errors=True)

    def _post_alltoall(self, dest, into, to, n, process_set):
        """The exchange as one alltoall with one non-empty slot each way; it takes its place in
        the core's one order of collectives, so the next collective waits for it."""
        splits = [0] * n
        splits[to] = dest.numel()
        pending = collectives.with_output(
            TORCH,
            "alltoall",
            ops.ALLTOALL,
            dest,
            "buddy.commit.%d" % self.uid,
            out=into,
            splits=splits,
            process_set=resolve(process_set),
        )
        return collectives.start(pending, then=lambda r: r[0])

    def _post_p2p(self, dest, into, to, process_set):
        """The exchange as a send to the holder and a receive from the buddy: point-to-point
        bypasses the core's order of collectives, so training's collectives run meanwhile. The
        barrier between them puts every receive in place before any send starts: a message that
        finds no receive would be kept whole in fresh memory and copied once more (page faults
        and a further pass over the shard, measured: docs/elastic.md)."""
        tag = 7000 + self.uid  # one per BuddyCopies: several may be in flight at once
        recv = p2p_ops.recv_async(into, self.buddy_of, tag=tag, process_set=process_set)
        mpi_ops.barrier(process_set)
        return (recv, p2p_ops.send_async(dest, to, tag=tag, process_set=process_set))

    def _pack(self, parts, numel):
        """Copies `parts` into the older own buffer (one pass) and returns it. A shared one's
        version reads 0 while it is written, so its buddy never takes it half packed."""
        slot = 0 if self.own_versions[0] <= self.own_versions[1] else 1
        self.own_versions[slot] = 0
        dest = self.own[slot]
        if dest is None or dest.numel() != numel or dest.dtype != parts[0].dtype:
            self.own[slot] = dest = None  # the old buffer goes before the new one is allocated
            dest = self.own[slot] = torch.empty(numel, dtype=parts[0].dtype)
        shared = self._own_files[slot] if self._shared is not None else None
        if shared is not None:
            shared.version = 0
        torch.cat(parts, out=dest)
        if shared is not None:
            shared.version = self.version
        self.own_versions[slot] = self.version
        return dest

    def _share(self, numel, dtype, buddy_of, process_set):
        """Collective, once per world and shard size: every member makes its two own buffers
        files in /dev/shm, maps its buddy's, and they are unlinked (buddy_shm.py). Where any
        member fails, every member keeps private buffers and exchanges copies instead."""
        self._drop_shared()
        prefix = name_prefix(self.uid)
        try:
            self._own_files = [SharedShard("%s-%d" % (prefix, s), numel, dtype, True) for s in (0, 1)]
        except OSError:
            self._drop_shared()
        made = allgather_object(
            prefix if self._own_files else None, name="buddy.share.%d" % self.uid, process_set=process_set
        )
        theirs = made[buddy_of]
        try:
            if all(made):
                self._buddy_files = [SharedShard("%s-%d" % (theirs, s), numel, dtype, False) for s in (0, 1)]
        except (OSError, exceptions.PreconditionError):
            self._buddy_files = []
        mapped = allgather_object(
            bool(self._buddy_files), name="buddy.mapped.%d" % self.uid, process_set=process_set
        )
        for f in self._own_files:
            f.unlink()  # every buddy mapped it (or gave up): only mappings keep the pages now
        if not all(mapped):
            self._drop_shared()
            return
        self._shared = (numel, dtype)
        self.own = [f.data for f in self._own_files]
        self.own_versions = [0, 0]
        self.buddy = [f.data for f in self._buddy_files]
        self.buddy_versions = [0, 0]
        self.buddy_of = buddy_of

    def _drop_shared(self):
        """Back to private buffers (the shared ones, and the copies they held, are dropped)."""
        for f in self._own_files:
            f.unlink()
        if self._shared is not None:
            self.own, self.own_versions = [None, None], [0, 0]
            self.buddy, self.buddy_versions = [None, None], [0, 0]
        self._own_files, self._buddy_files, self._shared = [], [], None
        self._share_tried = None

    def info(self):
        """What this rank holds, as recover() exchanges it."""
        if self._shared is not None:  # the buddy's files as it left them (alive or not)
            self.buddy_versions = [f.version for f in self._buddy_files]
        if not any(self.own_versions):
            return None
        versions = [v for v in self.own_versions if v]
        numel = next(b.numel() for b, v in zip(self.own, self.own_versions) if v and b is not None)
        buddy = [v for v in self.buddy_versions if v]
        return (self.position, self.size, versions, self.buddy_of, buddy, self.holder, numel)

    def own_copy(self, version):
        """This rank's own copy at `version`, or None."""
        for buf, v in zip(self.own, self.own_versions):
            if v and v == version:
                return buf
        return None

    def recover(self, process_set=None, needed=None):
        """After the job re-formed: agrees on the version to rebuild and on which survivor sends
        each old shard (`needed`: only these old positions must have a copy; default every one).
        Collective over the new `process_set`; returns a RecoveryPlan."""
        process_set = process_set or global_process_set
        self.settle()  # the old world's exchange: completed before the failure, or lost
        infos = allgather_object(self.info(), name="buddy.recover", process_set=process_set)
        version, source = choose_sources(infos, needed=needed)
        me = list(process_set.ranks).index(global_rank())
        return RecoveryPlan(self, infos, version, source, me)


def choose_sources(infos, at_most=None, needed=None):
    """(version, {old position: new position of the survivor sending it}) from every new member's
    info() (None for a member without copies): the newest version (not above `at_most`) of which
    every old shard (every one in `needed`, when given) has a copy. Raises ShardsLostError when
    there is none."""
    known = [i for i in infos if i is not None]
    if not known:
        raise exceptions.ShardsLostError("no surviving rank holds a committed shard; " + CHECKPOINT_HINT)
    old_size, holder = known[0][1], known[0][5]
    if any(i[1] != old_size for i in known):
        raise exceptions.ShardsLostError(
            "the survivors hold shards of different commits' worlds (%s); %s"
            % (sorted({i[1] for i in known}), CHECKPOINT_HINT)
        )
    versions = sorted({v for i in known for v in i[2] if at_most is None or v <= at_most}, reverse=True)
    newest_missing = None  # what the newest commit lacks: what the error names
    for v in versions:
        source: dict[int, int] = {}
        for new, i in enumerate(infos):
            if i is not None and v in i[2]:
                source.setdefault(i[0], new)
        for new, i in enumerate(infos):
            if i is not None and v in i[4] and i[3] is not None:
                source.setdefault(i[3], new)
        missing = [j for j in (range(old_size) if needed is None else needed) if j not in source]
        if not missing:
            return v, source
        newest_missing = newest_missing or missing
    raise exceptions.ShardsLostError(
        "cannot rebuild the last commit's shards: %s; %s"
        % (
            "; ".join(
                "rank %d and rank %d (which kept its buddy copy) were both lost" % (j, holder[j])
                if all(i[0] not in (j, holder[j]) for i in known)
                else "rank %d's shard has no copy of the same commit as the others' (a rank failed "
                "during a commit)" % j
                for j in newest_missing or []
            ),
            CHECKPOINT_HINT,
        )
    )


@dataclasses.dataclass
class RecoveryPlan:
    """The agreed sources of the old shards (old positions are ranks of the old process set)."""

    copies: BuddyCopies
    infos: list[Any]
    version: int
    source: dict[int, int]  # old position -> new position sending it
    me: int  # this rank's position in the new process set
    old_size: int = 0
    numel: int = 0  # elements of every old shard's copy

    def __post_init__(self):
        self.old_size = next(i[1] for i in self.infos if i is not None)
        self.numel = next(i[6] for i in self.infos if i is not None)

    def at(self, version):
        """This plan rebuilding `version` instead (no collective: every rank has the infos)."""
        got, source = choose_sources(self.infos, at_most=version)
        if got != version:
            raise exceptions.ShardsLostError("commit %d cannot be rebuilt; %s" % (version, CHECKPOINT_HINT))
        return RecoveryPlan(self.copies, self.infos, version, source, self.me)

    def held(self):
        """{old position: its copy at the agreed version} for the shards this rank sends."""
        out = {}
        c = self.copies
        for j, new in self.source.items():
            if new != self.me:
                continue
            if j == c.position and c.own_copy(self.version) is not None:
                out[j] = c.own_copy(self.version)
            elif j == c.buddy_of and self.version in c.buddy_versions:
                out[j] = c.buddy[c.buddy_versions.index(self.version)]
        return out

    def fetch(self, ranges, process_set=None):
        """{old position j: [elements [a, b) of j's shard for each (a, b) in ranges(j, me)]} on
        every member `me` of the new `process_set`. `ranges(j, k)`: the element ranges of old
        shard j that new member k needs (every rank must compute the same). Collective: one
        alltoall; each rank sends only the pieces of the shards it was chosen to send."""
        process_set = process_set or global_process_set
        ranks = list(process_set.ranks)
        me, m = self.me, len(ranks)
        held = self.held()
        parts, splits = [], [0] * m
        for k in range(m):
            for j in sorted(held):
                for a, b in ranges(j, k):
                    parts.append(held[j][a:b])
                    splits[k] += b - a
        own = self.copies.own_copy(self.version)
        dtype = next(iter(held.values())).dtype if held else (own.dtype if own is not None else torch.float32)
        send = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)
        if m > 1:
            handle = mpi_ops.alltoall_async(send, splits=splits, name="buddy.fetch", process_set=process_set)
            got, got_splits = mpi_ops.synchronize(handle)
            offsets = [0]
            for s in got_splits.tolist():
                offsets.append(offsets[-1] + s)
        else:
            got, offsets = send, [0, send.numel()]
        by_source: dict[int, list[int]] = {}
        for j in range(self.old_size):
            by_source.setdefault(self.source[j], []).append(j)
        out = {}
        for s, js in by_source.items():
            pos = offsets[s]
            for j in sorted(js):
                pieces = []
                for a, b in ranges(j, me):
                    pieces.append(got[pos : pos + b - a])
                    pos += b - a
                out[j] = pieces
        return out

    def fetch_whole(self, assignment, process_set=None):
        """{old position j: its whole shard} on each new member, for the old shards
        `assignment[k]` (a list of old positions) names for new member k: a survivor taking over
        a lost rank's shard as it was (same layout, e.g. a mesh job's dp=1 shard). Collective."""
        wanted = {j: k for k, js in assignment.items() for j in js}

        def ranges(j, k):
            return [(0, self.numel)] if wanted.get(j) == k else []

        return {j: pieces[0] for j, pieces in self.fetch(ranges, process_set).items() if pieces}
