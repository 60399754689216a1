"""A device mesh over the job's ranks: pipeline (pp), data (dp), expert (ep), context (cp) and
tensor (tp) parallel axes, framework-neutral.

Rank layout: tp is the innermost axis (consecutive ranks, so on one host when ranks are
placed host by host), then cp, then ep, then dp, and pp outermost (Megatron-Core's order)::

    rank = (((pp_index * dp + dp_index) * ep + ep_index) * cp + cp_index) * tp + tp_index

``MeshLayout`` is the pure arithmetic (no runtime needed); with ``members`` its positions are
those global ranks (position i above is rank members[i]): how a mesh re-formed on the
survivors of an elastic job (hvdlite/parallel/reform.py) places its coordinates. ``Mesh`` registers, at
construction, one process set for every group of every single axis, of the axis combinations
add-ons use (``COMBINATIONS``: ("dp", "ep") for MoE statistics, ("dp", "cp") for gradient
averaging under context parallelism) and of any the caller names; a group equal to one
already registered is not registered again. Pipelines need no sets of their own: stages
send to each other point-to-point on their pp group's set. Construction is collective: every rank must build
the same Mesh at the same point of its program, because hvd.add_process_set is. The first
``process_set`` of any other combination registers its groups then, and so is collective too.
"""

import collections
import itertools
import math

from hvdlite.common import exceptions
from hvdlite.common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hvdlite.common.topology import rank as _world_rank
from hvdlite.common.topology import size as _world_size

AXES = ("pp", "dp", "ep", "cp", "tp")  # outermost first

# Axis combinations registered with every Mesh (the ones the add-ons ask for).
COMBINATIONS = (("dp", "ep"), ("dp", "cp"))

MeshCoords = collections.namedtuple("MeshCoords", ["pp", "dp", "ep", "cp", "tp"])  # AXES


def _axes_of(axis):
    """A canonical (outermost-first) tuple of axis names from a name or a sequence of names."""
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    unknown = [a for a in names if a not in AXES]
    if unknown or not names or len(set(names)) != len(names):
        raise exceptions.InvalidArgumentError(
            "mesh axis %r: give one of %s, or a tuple of distinct ones" % (axis, ", ".join(AXES))
        )
    return tuple(a for a in AXES if a in names)


class MeshLayout:
    """The arithmetic of a pp x dp x ep x cp x tp mesh over `world_size` ranks. Pure Python:
    it needs no runtime, so a layout can be planned (and tested) for any size."""

    def __init__(self, world_size, pp=1, dp=-1, ep=1, tp=1, cp=1, members=None):
        sizes = {"pp": pp, "dp": dp, "ep": ep, "cp": cp, "tp": tp}
        bad = {a: s for a, s in sizes.items() if not isinstance(s, int) or (s < 1 and s != -1)}
        free = [a for a, s in sizes.items() if s == -1]
        if bad or len(free) > 1:
            raise exceptions.InvalidArgumentError(
                "mesh sizes must be positive ints with at most one -1 (the remainder); got %s"
                % ", ".join("%s=%r" % kv for kv in sizes.items())
            )
        fixed = math.prod(s for s in sizes.values() if s != -1)
        if free:
            if world_size % fixed:
                raise exceptions.InvalidArgumentError(
                    "mesh %s: %d ranks are not divisible by %d, so %s=-1 has no whole size"
                    % (_sizes_text(sizes), world_size, fixed, free[0])
                )
            sizes[free[0]] = world_size // fixed
        if math.prod(sizes.values()) != world_size:
            raise exceptions.InvalidArgumentError(
                "mesh %s has %d ranks but the job has %d; make the product equal the job size "
                "or give one axis -1" % (_sizes_text(sizes), math.prod(sizes.values()), world_size)
            )
        self.world_size = world_size
        self.sizes = sizes
        self.members = list(range(world_size)) if members is None else [int(r) for r in members]
        if len(self.members) != world_size or len(set(self.members)) != world_size:
            raise exceptions.InvalidArgumentError(
                "mesh %s: members must be %d distinct global ranks, got %r"
                % (_sizes_text(sizes), world_size, members)
            )
        self._position = {r: i for i, r in enumerate(self.members)}

    def coords_of(self, rank):
        """MeshCoords of a global rank (a member)."""
        if rank not in self._position:
            raise exceptions.InvalidArgumentError(
                "rank %d is not a member of mesh %s (members %s)"
                % (rank, _sizes_text(self.sizes), self.members)
            )
        pos, out = self._position[rank], {}
        for axis in reversed(AXES):
            out[axis] = pos % self.sizes[axis]
            pos //= self.sizes[axis]
        return MeshCoords(**out)

    def rank_of(self, **coords):
        """The global rank at the given coordinates (missing axes: 0)."""
        pos = 0
        for axis in AXES:
            pos = pos * self.sizes[axis] + int(coords.get(axis, 0))
        return self.members[pos]

    def groups(self, axis):
        """Every group of `axis` (a name or a tuple of names) as a list of ascending rank lists,
        in the order of their smallest rank. Ranks of one group differ only along `axis`."""
        axes = _axes_of(axis)
        by_key: dict[tuple[int, ...], list[int]] = {}
        for r in sorted(self.members):
            c = self.coords_of(r)
            key = tuple(getattr(c, a) for a in AXES if a not in axes)
            by_key.setdefault(key, []).append(r)
        return sorted(by_key.values())

    def group_of(self, axis, rank):
        """The ranks of `rank`'s group along `axis`."""
        axes = _axes_of(axis)
        c = self.coords_of(rank)
        fixed = {a: getattr(c, a) for a in AXES if a not in axes}
        ranges = [range(self.sizes[a]) if a in axes else (fixed[a],) for a in AXES]
        return sorted(self.rank_of(**dict(zip(AXES, idx))) for idx in itertools.product(*ranges))

    def all_groups(self, combinations=None):
        """Every distinct rank group of every single axis and of each combination of axes in
        `combinations` (default ``COMBINATIONS``; "all" for every non-empty combination): the
        order in which Mesh registers them (the same on every rank)."""
        if combinations == "all":
            combos = [c for n in range(2, len(AXES) + 1) for c in itertools.combinations(AXES, n)]
        else:
            combos = [_axes_of(c) for c in (COMBINATIONS if combinations is None else combinations)]
        seen, out = set(), []
        for axes in [(a,) for a in AXES] + combos:
            for g in self.groups(axes):
                if tuple(g) not in seen:
                    seen.add(tuple(g))
                    out.append(g)
        return out

    def describe(self):
        """A multi-line text: sizes, and every group of every axis."""
        lines = [
            "mesh %s over %d ranks (tp innermost, pp outermost)" % (_sizes_text(self.sizes), self.world_size)
        ]
        if self.members != list(range(self.world_size)):
            lines.append("  members (layout order) %s" % self.members)
        for axis in AXES:
            groups = self.groups(axis)
            lines.append("  %-2s size %-3d groups %s" % (axis, self.sizes[axis], _groups_text(groups)))
        return "\n".join(lines)


def _sizes_text(sizes):
    return "(%s)" % ", ".join("%s=%s" % (a, sizes[a]) for a in AXES)


def _groups_text(groups, limit=8):
    text = " ".join("[%s]" % ",".join(map(str, g)) for g in groups[:limit])
    return text + (" ... (%d groups)" % len(groups) if len(groups) > limit else "")


class Mesh:
    """hvd.Mesh(pp=1, dp=-1, ep=1, tp=1, cp=1, combinations=None): this job's ranks as a
    5-axis mesh (-1: whatever is left). Collective: every rank must construct it with the same
    arguments, in the same order relative to its other collectives. `combinations` lists
    further axis tuples whose sets to register now (default: ``COMBINATIONS``)."""

    def __init__(self, pp=1, dp=-1, ep=1, tp=1, cp=1, combinations=()):
        self.layout = MeshLayout(_world_size(), pp=pp, dp=dp, ep=ep, tp=tp, cp=cp)
        self._rank = _world_rank()
        self.coords = self.layout.coords_of(self._rank)
        self._sets: dict[tuple[int, ...], ProcessSet] = {}
        self._combos = list(COMBINATIONS) + [_axes_of(c) for c in combinations]
        self._given: dict[tuple[str, ...], ProcessSet] = {}  # axes -> the set process_set() handed out
        self._register(self.layout.all_groups(self._combos))

    @classmethod
    def from_layout(cls, layout, combinations=()):
        """A Mesh over a planned `layout` (a MeshLayout over every rank of the job, with its
        `members`): what a worker joining a re-formed mesh builds (hvdlite/torch/parallel/mesh/
        state.py, MeshState.join). Collective as the constructor, and registers the same sets as
        reform() to that layout with the same `combinations` (every axis tuple beyond the
        singles, COMBINATIONS included)."""
        if sorted(layout.members) != list(range(_world_size())):
            raise exceptions.InvalidArgumentError(
                "Mesh.from_layout: members %s must be every rank of the job (0..%d)"
                % (layout.members, _world_size() - 1)
            )
        self = cls.__new__(cls)
        self.layout = layout
        self._rank = _world_rank()
        self.coords = layout.coords_of(self._rank)
        self._sets = {}
        self._combos = [_axes_of(c) for c in combinations] or list(COMBINATIONS)
        self._given = {}
        self._register(layout.all_groups(self._combos))
        return self

    @property
    def sizes(self):
        """{axis: size} for pp, dp, ep, cp, tp."""
        return dict(self.layout.sizes)

    def size(self, axis=None):
        """Members along `axis` (a name or tuple of names); the job size without one."""
        if axis is None:
            return self.layout.world_size
        return math.prod(self.layout.sizes[a] for a in _axes_of(axis))

    def rank(self, axis=None):
        """This rank's index along `axis` (for a tuple of axes: its index in that combined
        group, outer axes major); its global rank without one."""
        if axis is None:
            return self._rank
        return self.layout.group_of(axis, self._rank).index(self._rank)

    def ranks(self, axis):
        """The global ranks of this rank's group along `axis`, ascending."""
        return self.layout.group_of(axis, self._rank)

    def _register(self, groups, reuse=None):
        """Registers each group not registered yet (collective: every rank, same groups).
        reuse: {group: an unregistered ProcessSet object to register for it} (reform())."""
        world = tuple(range(_world_size()))
        for group in groups:
            key = tuple(group)
            if key in self._sets:
                continue
            if key == world:
                self._sets[key] = global_process_set
                continue
            ps = (reuse or {}).get(key) or ProcessSet(list(group))
            ps._ranks = list(group)  # a reused object takes its new group's ranks (reform())
            self._sets[key] = add_process_set(ps, allow_duplicate=True)

    def process_set(self, axis):
        """The registered process set of this rank's group along `axis` (a name, or a tuple
        of names such as ("dp", "ep")); the global set when the group is every rank. A
        combination not registered at construction is registered now, for every group of it:
        then this call is collective (every rank calls it at the same point). The object
        returned stays this rank's `axis` set across reform(), which re-points it."""
        axes = _axes_of(axis)
        key = tuple(self.ranks(axes))
        if key not in self._sets:
            if axes not in self._combos and len(axes) > 1:
                self._combos.append(axes)
            self._register(self.layout.groups(axes))
        ps = self._sets[key]
        self._given.setdefault(axes, ps)
        return self._given[axes]

    def registered(self):
        """Whether every set of the mesh, and every one process_set() handed out, is registered
        (False after an elastic reset, which unregisters every set, until reform())."""
        return all(ps.process_set_id is not None for ps in [*self._sets.values(), *self._given.values()])

    def reform(self, members, dp):
        """Re-lays the mesh over `members` (global ranks in layout order; hvdlite/parallel/reform.py
        plans them) with `dp` data-parallel replicas, the other axes unchanged, and re-registers
        its process sets over the current job (collective over the job: every rank, same
        arguments; the job's ranks must be exactly `members`). Sets registered before are removed
        first; after an elastic reset they are gone already. Each set process_set() handed out
        is re-pointed in place at this rank's new group along its axes, so the layers holding it
        (tensor-parallel linears, pipeline stages) need not be rebuilt; where two of them now name
        one group, the later one shares the first one's id."""
        if sorted(members) != list(range(_world_size())):
            raise exceptions.InvalidArgumentError(
                "Mesh.reform: members %s must be every rank of the job (0..%d)" % (members, _world_size() - 1)
            )
        self.remove()
        sizes = dict(self.layout.sizes, dp=dp)
        self.layout = MeshLayout(len(members), members=members, **sizes)
        self._rank = _world_rank()
        self.coords = self.layout.coords_of(self._rank)
        given, reuse = self._given, dict[tuple[int, ...], ProcessSet]()
        for axes, ps in sorted(given.items()):
            key = tuple(self.layout.group_of(axes, self._rank))
            if ps is not global_process_set:
                reuse.setdefault(key, ps)
        self._register(self.layout.all_groups(self._combos), reuse)
        for axes, ps in given.items():
            canonical = self._sets[tuple(self.layout.group_of(axes, self._rank))]
            if ps is not canonical and ps is not global_process_set:
                ps._ranks, ps.process_set_id = list(canonical.ranks), canonical.process_set_id

    def pipeline_peer(self, offset):
        """The global rank of the pipeline stage `offset` stages after this one (wrapping)."""
        group = self.ranks("pp")
        return group[(self.coords.pp + offset) % len(group)]

    def describe(self):
        """The layout (every group of every axis) and this rank's coordinates."""
        return "%s\n  this rank %d at %s" % (self.layout.describe(), self._rank, _coords_text(self.coords))

    def __repr__(self):
        return "Mesh%s(rank=%d at %s)" % (
            _sizes_text(self.layout.sizes),
            self._rank,
            _coords_text(self.coords),
        )

    def remove(self):
        """Unregisters every process set of the mesh (collective, like construction)."""
        for ps in self._sets.values():
            if ps is not global_process_set and ps.process_set_id is not None:
                remove_process_set(ps)
        self._sets.clear()


def _coords_text(coords):
    return "(%s)" % ", ".join("%s=%d" % (a, getattr(coords, a)) for a in AXES)
