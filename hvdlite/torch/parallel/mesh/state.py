"""MeshState: the elastic state of a hvd.Mesh job (dp x pp x tp, with ep and cp), which re-forms on
the survivors of a loss through the ordinary ``hvd.elastic.run`` loop::

    mesh = hvd.Mesh(pp=2, tp=2)                    # dp: the rest
    stage, opt = build(mesh)                       # this rank's shard of the model
    state = hvd.parallel.MeshState(mesh, model=stage, optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            for replica in state.replicas():       # the original dp replicas this rank computes
                ...forward/backward on replica's batch (gradients accumulate)...
            allreduce the gradients with op=hvd.Sum over mesh.process_set("dp"), divide by
            state.dp_replicas; opt.step(); state.step += 1; state.commit()

What is kept where: each rank keeps (commit(), in host memory, as TorchState does) its own
model and optimizer shard, that of its coordinate (pp, ep, cp, tp); the dp replicas of a
coordinate hold identical copies. With buddies (the default where dp is 1; buddies=True/False
decides), commit() also keeps the shard as a buddy copy (copies.py): on this rank and on one
peer on another host. sync(), which hvd.elastic.run calls when the job (re-)forms, does,
collectively over the new job:

1. gathers every rank's coordinate and old dp index, and plans the new layout
   (hvdlite/parallel/reform.py): dp shrinks to the largest size the survivors fill, one holder
   per (coordinate, new replica), lowest old dp index first. A coordinate with no survivor is
   taken by a replacement worker (one the driver started on a free slot that called join()),
   restored from its buddy copy; with no buddy copies, or no replacement, it is an error on every
   rank naming it (see the last checkpoint).
2. when the plan releases ranks (survivors beyond the new dp, or workers the driver added
   later that are not needed), or needs the ranks renumbered (a replacement must sit at its
   coordinate's place in rank order), rank 0 tells the elastic driver
   (hvdlite/runner/elastic_retired.py) and every rank raises HostsUpdatedInterrupt: the driver
   forms the next generation without the released (they exit 0 with a log line) and in the
   order asked for, and sync() runs again there (so one loss costs two resets).
3. otherwise re-forms the mesh over the job (Mesh.reform: the process sets the layers hold are
   re-pointed in place) and, where a coordinate was restored, every rank loads the newest commit
   all the shards have a copy of (survivors their own copy, replacements the buddy's); else
   broadcasts model and optimizer from each new dp group's first rank (its chosen holder) to the
   others (exact: hvd.broadcast_optimizer_state runs no step). Plain values (step, epoch) come
   from the first survivor; with buddies the new job then commits (buddies placed anew).

A replacement worker (joined_late() is true after hvd.init()) calls join() instead of building
hvd.Mesh: it takes part in step 1 (and in the resets of step 2) and returns the Mesh at the
coordinate it takes, for which the script builds its model and optimizer and a MeshState, then
calls the run function: its first sync() is step 3.

The global batch is kept: replicas() lists the original dp replicas (of dp_replicas) this rank
now computes, so a script that accumulates their gradients and divides the dp sum by
dp_replicas trains on the same batches with the same arithmetic, up to summation order.
Contract: construct it on every rank after the mesh, model and optimizer; a rank's coordinate
never changes (survivors keep their shard), so layers built for it stay valid.
"""

import collections
import copy
import itertools
import sys

import torch

from hvdlite.common.exceptions import (
    HostsUpdatedInterrupt,
    HvdliteInternalError,
    NotSupportedError,
    ShardsLostError,
)
from hvdlite.common.objects import allgather_object, broadcast_object
from hvdlite.common.topology import rank
from hvdlite.elastic import worker
from hvdlite.elastic.state import ObjectState
from hvdlite.parallel import reform
from hvdlite.parallel.mesh import Mesh, MeshLayout
from hvdlite.torch.diloco import DiLoCo
from hvdlite.torch.elastic.state import TorchState
from hvdlite.torch.functions import broadcast_optimizer_state, broadcast_parameters
from hvdlite.torch.parallel.mesh import shard_copy
from hvdlite.torch.parallel.mesh.copies import MeshCopies

# What a re-formation decided, the same on every rank: plan (reform.Plan), sizes and combos of the
# mesh, dp_replicas, root (the first rank holding state: plain values come from it) and
# assignment ({new rank: the old rank whose shard it loads}; empty unless a coordinate is restored).
Reformed = collections.namedtuple(
    "Reformed", ["plan", "sizes", "combos", "dp_replicas", "root", "assignment"]
)


def _is_shard(handler):
    return isinstance(handler.value, (torch.nn.Module, torch.optim.Optimizer))


class MeshState(TorchState):
    """TorchState of a mesh job: ``MeshState(mesh, model=..., optimizer=..., step=0, ...)``.
    Keywords as TorchState's (modules and optimizers: this rank's shards); buddies: keep buddy
    copies of the shard (None: where dp is 1); see the module doc."""

    mesh: Mesh
    dp_replicas: int
    _held: tuple[tuple[int, ...], int]  # (this rank's coordinate, its dp index) in the last layout
    _sizes: dict[str, int]
    _lost_from: dict[tuple[int, ...], list[int]]
    _buddies: bool | None  # None: on where dp is 1
    _overlap: bool
    _copies: MeshCopies | None
    _joined: Reformed | None  # join()'s decision, until the first sync() uses it
    _packed: bool  # the last commit packed the shard (MeshCopies): restore() unpacks it

    def __init__(self, mesh, model=None, optimizer=None, buddies=None, buddy_overlap=True, **kwargs):
        if any(isinstance(v, DiLoCo) for v in (model, optimizer, *kwargs.values())):
            raise NotSupportedError("MeshState does not take hvd.DiLoCo; use TorchState for local SGD")
        joined = getattr(mesh, "_mesh_state_join", None)  # join() built this mesh
        object.__setattr__(self, "mesh", mesh)  # None: a worker that joined late and takes nothing
        dp_replicas = joined.dp_replicas if joined else mesh.size("dp") if mesh else 0
        object.__setattr__(self, "dp_replicas", dp_replicas)  # the dp the job started with
        held = (reform.key_of(mesh.coords), mesh.coords.dp) if mesh else None
        object.__setattr__(self, "_held", held)
        object.__setattr__(self, "_sizes", dict(mesh.sizes) if mesh else None)  # the last sync's layout
        object.__setattr__(self, "_lost_from", {})
        object.__setattr__(self, "_buddies", buddies)
        object.__setattr__(self, "_overlap", bool(buddy_overlap))
        object.__setattr__(self, "_copies", None)  # MeshCopies while buddies are on
        object.__setattr__(self, "_joined", joined)
        object.__setattr__(self, "_packed", False)
        super().__init__(model, optimizer, buddy_overlap=buddy_overlap, **kwargs)

    @staticmethod
    def joined_late():
        """Whether the elastic driver started this worker after the job's first generation (a
        host found or returned later, or a free slot replacing a lost worker). Such a worker holds
        no shard: it calls join() (or, to leave at once, runs the run function with
        ``MeshState(None)``, whose sync() releases it: it exits 0). Call after hvd.init()."""
        ctx = worker.context()
        return ctx is not None and ctx.started_in() > 1

    @classmethod
    def join(cls):
        """For a worker that joined late: takes part in the running job's re-formation and
        returns the Mesh at the coordinate it takes over (restored from its buddy copy by the
        first sync() of the MeshState the script makes with the model it builds for
        ``mesh.coords``). Where the job needs no replacement the worker is released (exit status
        0) inside. Collective, with the survivors' sync()."""
        ctx = worker.context()
        if ctx is None:
            raise NotSupportedError(
                "MeshState.join() is for a worker the elastic driver started (hvdliterun --min-np)"
            )
        while True:
            try:
                got = _plan((None, ctx.worker_id, None, True, False, None, None, 0), None)
                break
            except (HostsUpdatedInterrupt, HvdliteInternalError) as e:
                ctx.reset(e)  # the next generation: leaves (exit status 0) where it has no place
        plan = got.plan
        layout = MeshLayout(len(plan.members), members=plan.members, **dict(got.sizes, dp=plan.dp))
        mesh = Mesh.from_layout(layout, got.combos)
        mesh._mesh_state_join = got
        return mesh

    def replicas(self):
        """The original dp replicas (0..dp_replicas-1) whose batches this rank computes now: its
        own alone before any loss; after dp shrank, every dp-th one from its new dp index."""
        dp, me = self.mesh.size("dp"), self.mesh.rank("dp")
        return [v for v in range(self.dp_replicas) if v % dp == me]

    def _buddies_on(self):
        return (
            self._buddies
            if self._buddies is not None
            else self.mesh is not None and self.mesh.size("dp") == 1
        )

    def _shards(self):
        return {k: h for k, h in self._handlers.items() if _is_shard(h)}

    def save(self):
        """Without buddies, TorchState's. With them the packed own copy is the commit point (no
        copy of the shard's state_dicts besides it; they are kept only while commits are skipped,
        before the optimizers' first step): the samplers and plain values, then the buddy copies'
        commit (collective)."""
        if self._copies is None:
            super().save()
            return
        self._copies.copies.settle(raise_errors=True)  # the last commit's exchange fails here
        shards = self._shards()
        for handler in self._handlers.values():
            if not _is_shard(handler):
                handler.save()
        ObjectState.save(self)
        complete = all(
            len(h.value.state) > 0 for h in shards.values() if isinstance(h.value, torch.optim.Optimizer)
        )
        states = {k: h.value.state_dict() for k, h in shards.items()}
        packed = self._copies.commit(states, copy.deepcopy(self._saved_state), complete)
        for handler in shards.values():
            if packed:
                handler._saved = None
            else:
                handler.save()
        object.__setattr__(self, "_packed", packed)

    def restore(self):
        """The last commit: from the newest own packed copy where the last commit packed one."""
        if self._copies is None or not self._packed:
            super().restore()
            return
        version, flat = self._copies.newest_own()
        self._load(shard_copy.decode(flat), "this rank's own copy")
        self._saved_state = self._copies.plain_of(version)
        for handler in self._handlers.values():
            if not _is_shard(handler):
                handler.restore()
        ObjectState.restore(self)

    def _load(self, states, what):
        shards = self._shards()
        if sorted(states) != sorted(shards):
            raise NotSupportedError(
                "MeshState: %s holds %s, this rank's MeshState has %s: a replacement must pass the "
                "same model and optimizer keywords" % (what, sorted(states), sorted(shards))
            )
        for key, sd in states.items():
            shards[key].value.load_state_dict(sd)

    def check_host_updates(self):
        """As State's, but a mesh always re-plans when the job changed (never skips sync());
        the buddy exchange still running ends first (every rank is alive)."""
        try:
            super().check_host_updates()
        except HostsUpdatedInterrupt:
            if self._copies is not None:
                self._copies.copies.settle()
            raise HostsUpdatedInterrupt(skip_sync=False) from None

    def sync(self):
        got = self._joined
        object.__setattr__(self, "_joined", None)
        if got is None:
            got = self._reform()
        if got.assignment:
            self._restore_shards(got.assignment)
        elif self.mesh.size("dp") > 1:
            root, dp = self.mesh.ranks("dp")[0], self.mesh.process_set("dp")
            for handler in self._shards().values():
                value = handler.value
                if isinstance(value, torch.nn.Module):
                    broadcast_parameters(value.state_dict(), root_rank=root, process_set=dp)
                else:
                    broadcast_optimizer_state(value, root_rank=root, process_set=dp)
        for handler in self._handlers.values():
            if not _is_shard(handler):  # samplers
                handler.value.load_state_dict(
                    broadcast_object(handler.value.state_dict(), root_rank=got.root)
                )
        if self._saved_state:
            self._saved_state = broadcast_object(
                self._saved_state, root_rank=got.root, name="mesh_state.plain"
            )
            self._set_attrs()
        object.__setattr__(self, "_lost_from", _holders_of(self.mesh))
        self._place_copies()

    def _place_copies(self):
        """After a (re-)formation: with buddies, the new job's first commit (placed anew)."""
        for handler in self._shards().values():  # the commit point until the copies are placed
            handler.save()
        object.__setattr__(self, "_packed", False)
        if not self._buddies_on():
            object.__setattr__(self, "_copies", None)
            return
        if self._copies is None:
            object.__setattr__(self, "_copies", MeshCopies(self._overlap))
        else:
            self._copies.forget()
        self.save()

    def _restore_shards(self, assignment):
        """Every rank loads the shard `assignment` gives it, at the newest commit all of them have
        a copy of, and that commit's plain values (a replacement gets them from the root)."""
        copies = self._copies
        if copies is None:  # a replacement: it holds no copy, only receives one
            copies = MeshCopies(self._overlap)
            object.__setattr__(self, "_copies", copies)
        version, flat = copies.fetch(assignment)
        self._load(shard_copy.decode(flat), "the copy of old rank %d's shard" % assignment[rank()])
        plain = copies.plain_of(version)
        if plain is not None:
            self._saved_state = plain

    def _reform(self):
        """Steps 1-2 of the module doc, and the mesh's re-layout; returns the Reformed."""
        ctx = worker.context()
        copies = self._copies.copies if self._copies is not None else None
        position = copies.position if copies is not None and any(copies.own_versions) else None
        mine = (
            self._held,
            ctx.worker_id if ctx is not None else None,
            self._sizes,
            False,
            self._buddies_on() if self.mesh is not None else False,
            position,
            list(self.mesh._combos) if self.mesh is not None else None,
            self.dp_replicas,
        )
        got = _plan(mine, self._lost_info)
        object.__setattr__(self, "_sizes", got.sizes)
        plan, layout = got.plan, self.mesh.layout
        if plan.members != layout.members or plan.dp != layout.sizes["dp"] or not self.mesh.registered():
            self.mesh.reform(plan.members, plan.dp)
        object.__setattr__(self, "_held", (reform.key_of(self.mesh.coords), self.mesh.coords.dp))
        object.__setattr__(self, "_sizes", dict(self.mesh.sizes))
        return got

    def _lost_info(self, lost):
        """{coordinate: (old ranks that held it, the old ranks keeping their buddy copies)} for
        the coordinates `lost` (on the first surviving rank, which broadcasts it)."""
        lost_from = self._lost_from or (_holders_of(self.mesh) if self.mesh else {})
        holder = self._copies.copies.holder if self._copies is not None else None
        return {
            k: (lost_from.get(k, []), [holder[r] for r in lost_from.get(k, []) if holder and r < len(holder)])
            for k in lost
        }


def _plan(mine, lost_info):
    """Step 1 (and 2) of the module doc on every rank: `mine` = (held, worker id, sizes, can take
    a coordinate, buddies on, old position of its buddy copies, the mesh's combos, dp_replicas);
    `lost_info(lost)` (MeshState._lost_info) on the rank that broadcasts it. Returns Reformed, or
    raises HostsUpdatedInterrupt after asking the driver to release or renumber ranks."""
    every = allgather_object(mine, name="mesh_state.holders")
    holders = {r: e[0] for r, e in enumerate(every)}
    root = next((r for r, e in enumerate(every) if e[0] is not None), None)
    if root is None:
        raise NotSupportedError("MeshState: no rank of the job holds a mesh shard")
    sizes, buddies, combos, dp_replicas = every[root][2], every[root][4], every[root][6], every[root][7]
    held_keys = {tuple(e[0][0]) for e in every if e[0] is not None}
    keys = itertools.product(*(range(sizes[a]) for a in reform.KEY_AXES))
    lost = [k for k in keys if k not in held_keys]
    info = {}
    if lost:
        info = broadcast_object(
            lost_info(lost) if rank() == root else None, root_rank=root, name="mesh_state.lost"
        )
    lost_from = {k: v[0] for k, v in info.items()}
    detail = {k: " (its buddy copy: old rank(s) %s)" % v[1] for k, v in info.items()} if buddies else None
    spares = [r for r, e in enumerate(every) if e[0] is None and e[3]] if buddies else []
    plan = reform.plan(sizes, holders, lost_from, spares, detail)
    if plan.order is not None or plan.released:
        _release(plan, every, sizes)
    assignment = {}
    if plan.restored:
        for r, e in enumerate(every):
            assignment[r] = lost_from[plan.restored[r]][0] if r in plan.restored else e[5]
        missing = [r for r, p in assignment.items() if p is None]
        if missing:
            raise ShardsLostError(
                "the mesh cannot restore coordinate(s) %s from buddy copies: rank(s) %s committed none "
                "yet (buddy copies start with the first commit after the optimizers' first step); "
                "restart from the last checkpoint" % (sorted(plan.restored.values()), missing)
            )
    return Reformed(plan, sizes, combos, dp_replicas, root, assignment)


def _release(plan, every, sizes):
    """Retires plan.released and asks for plan.order (rank 0 tells the driver) and raises
    HostsUpdatedInterrupt on every rank, so the job re-forms without them and in that order
    (module doc, step 2)."""
    ctx = worker.context()
    text = "mesh %s re-forms with dp=%d on %d rank(s)" % (
        _sizes_text(sizes),
        plan.dp,
        len(plan.order or plan.members),
    )
    if plan.restored:
        text += "; %s restored from buddy copies by rank(s) %s" % (
            ", ".join(reform._key_text(k) for k in plan.restored.values()),
            sorted(plan.restored),
        )
    if plan.order is not None:
        text += "; ranks renumbered: the next rank i is rank order[i], order %s" % plan.order
    if plan.released:
        text += "; released: rank(s) %s (worker(s) %s)" % (
            plan.released,
            ", ".join(str(every[r][1]) for r in plan.released),
        )
    if ctx is None:
        raise NotSupportedError(
            text + ": releasing or renumbering ranks needs the elastic driver (hvdliterun --min-np)"
        )
    if rank() in plan.released:
        sys.stderr.write("hvdlite.elastic: %s; this rank leaves the job (exit status 0)\n" % text)
    elif rank() == 0:
        sys.stderr.write("hvdlite.elastic: %s\n" % text)
    if rank() == 0:
        if plan.released:
            ctx.retire([every[r][1] for r in plan.released])
        if plan.order is not None:
            ctx.order([every[r][1] for r in plan.order])
    raise HostsUpdatedInterrupt(skip_sync=False)


def _holders_of(mesh):
    """{coordinate: the global ranks that hold it} of the mesh's current layout."""
    out: dict[tuple[int, ...], list[int]] = {}
    for r in mesh.layout.members:
        out.setdefault(reform.key_of(mesh.layout.coords_of(r)), []).append(r)
    return out


def _sizes_text(sizes):
    return "(%s)" % ", ".join("%s=%d" % (a, sizes[a]) for a in ("pp", "dp", "ep", "cp", "tp"))
