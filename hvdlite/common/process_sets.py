"""Process sets: subgroups of ranks that run collectives among themselves.

Horovod's API: ``ProcessSet(ranks)``, ``add_process_set``,
``remove_process_set`` and ``global_process_set`` (id 0, every rank).
Adding and removing are collective over the whole job: every rank must make
the same calls in the same order.
"""

import array

from hvdlite.common import dtypes, exceptions, ops
from hvdlite.common.native import core as _core
from hvdlite.common.topology import rank, size


class ProcessSet:
    """A set of ranks. ``process_set_id`` is None until the set is registered."""

    def __init__(self, ranks_or_comm):
        """``ranks_or_comm``: global ranks, or an mpi4py communicator whose processes are
        the members (its ranks are mapped to MPI_COMM_WORLD ranks, which are hvdlite's
        ranks in a job started by mpirun)."""
        self.mpi_comm = None
        self._part_ids = None  # ProcessSet(comm): the ids of every rank's part, see add_process_set
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            ranks_or_comm = _world_ranks_of(ranks_or_comm)
        self._ranks = sorted(int(r) for r in ranks_or_comm)
        if len(set(self._ranks)) != len(self._ranks):
            raise exceptions.InvalidArgumentError(
                "ProcessSet ranks must be distinct, got %r" % (ranks_or_comm,)
            )
        self.process_set_id = None

    @property
    def ranks(self) -> list[int]:
        """The member ranks, ascending."""
        return self._ranks

    def _require_registered(self):
        if self.process_set_id is None:
            raise exceptions.PreconditionError(
                "process set %r is not registered; call hvd.add_process_set() on every rank first"
                % (self.ranks,)
            )

    def size(self):
        """The number of members; None while the set is not registered (as in Horovod)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks)

    def rank(self):
        """This process's rank within the set, or -1 if it is not a member; None while
        the set is not registered (as in Horovod)."""
        if self.process_set_id is None:
            return None
        me = rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        """Whether this process is a member (registered or not, as in Horovod)."""
        return rank() in self.ranks

    def __eq__(self, other):
        return (
            isinstance(other, ProcessSet)
            and self.ranks == other.ranks
            and self.process_set_id == other.process_set_id
        )

    def __hash__(self):
        return hash((tuple(self.ranks), self.process_set_id))

    def __repr__(self):
        return "ProcessSet(process_set_id=%r, ranks=%r, mpi_comm=%r)" % (
            self.process_set_id,
            self.ranks,
            self.mpi_comm,
        )


def _world_ranks_of(comm):
    """The MPI_COMM_WORLD ranks of an mpi4py intracommunicator's processes, in its rank order."""
    from mpi4py import MPI

    if comm == MPI.COMM_NULL:
        raise exceptions.InvalidArgumentError("ProcessSet(comm): comm is MPI.COMM_NULL")
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
    finally:
        group.Free()
        world.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise exceptions.InvalidArgumentError(
            "ProcessSet(comm): comm has processes outside MPI_COMM_WORLD (spawned or connected); "
            "hvdlite's ranks are MPI_COMM_WORLD's"
        )
    return ranks


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job; its ranks are read from the core once initialized."""

    def __init__(self):
        self.process_set_id = 0
        self.mpi_comm = None
        self._part_ids = None

    @property
    def ranks(self) -> list[int]:
        ranks = _core.process_set_ranks(0)
        if ranks is None:
            raise exceptions.PreconditionError("hvdlite is not initialized; call hvd.init() first")
        return ranks

    def __repr__(self):  # never raises, also before init()
        ranks = _core.process_set_ranks(0)
        shown = "<not initialized>" if ranks is None else ranks
        return "ProcessSet(process_set_id=0, ranks=%s, mpi_comm=%r)" % (shown, self.mpi_comm)


global_process_set = _GlobalProcessSet()


def set_global_comm(comm):
    """init(comm=...): comm (an mpi4py communicator, or None) becomes global_process_set.mpi_comm
    when it spans every process of this mpirun job; NotSupportedError otherwise."""
    if comm is not None:
        ranks = _world_ranks_of(comm) if _core.mpi_enabled() else None
        if ranks is None or sorted(ranks) != list(range(size())):
            raise exceptions.NotSupportedError(
                "init(comm=...) takes a communicator of every process of a job started by mpirun "
                "(MPI_COMM_WORLD or a duplicate); to run on fewer processes, launch only those"
            )
    global_process_set.mpi_comm = comm


_registry: dict[int, ProcessSet] = {}
# Ids of the sets an add-on registered with allow_duplicate=True (Mesh, ZeRO): they are the
# add-on's own, so they neither are duplicates nor make a user's set with their ranks one.
_addon_ids: set[int] = set()


def _reset_registry():
    for ps in _registry.values():
        ps.process_set_id = None
        ps._part_ids = None
    _registry.clear()
    _addon_ids.clear()


def add_process_set(process_set, allow_duplicate=False):
    """Registers a ProcessSet (or a list of ranks) on every rank; returns it
    with its id set. Collective: every rank must call it with the same ranks.
    As in Horovod, a set with the ranks of a registered one (the global set
    included) is a ValueError; allow_duplicate=True (an hvdlite extension, for
    add-ons that each own and remove their sets, such as Mesh and ZeRO)
    registers it under an id of its own, and such a set never makes a later one
    a duplicate."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise exceptions.PreconditionError("%r is already registered" % (ps,))
    if ps.mpi_comm is not None and not _core.mpi_enabled():
        raise exceptions.PreconditionError(
            "ProcessSet(comm) maps MPI_COMM_WORLD ranks to hvdlite ranks, so the job must be started by "
            "mpirun (or hvdliterun --mpi); this one was not: pass a list of ranks instead"
        )
    world = size()
    bad = [r for r in ps.ranks if r < 0 or r >= world]
    if bad or not ps.ranks:
        raise exceptions.InvalidArgumentError(
            "process set ranks %r must be a non-empty list of ranks in [0, %d)" % (ps.ranks, world)
        )
    if ps.mpi_comm is not None:
        return _add_comm_process_set(ps, allow_duplicate)
    same = [] if allow_duplicate else _registered_as(ps.ranks)
    if same:  # every rank holds the same table, so every rank raises here alike
        raise exceptions.InvalidArgumentError(
            "process set %r is a duplicate of the registered process set %d, as in Horovod"
            % (ps.ranks, same[0])
        )
    code, message, set_id = _core.add_process_set(ps.ranks)
    exceptions.raise_for_status(code, message)
    ps.process_set_id = set_id
    _registry[set_id] = ps
    if allow_duplicate:
        _addon_ids.add(set_id)
    return ps


def add_process_set_among_members(ranks):
    """Registers the set of global `ranks` calling on its members only (not collective over the
    job, unlike add_process_set): what torch.distributed needs for a subgroup, whose backend torch
    builds on the members alone. Every member must call it with the same ranks; sets registered
    at the same time by disjoint or overlapping groups stay apart. Returns the registered
    ProcessSet, kept out of Horovod's duplicate checks (it is its owner's, as an add-on's set).
    Blocks until every member has called it, bounded like any collective."""
    ps = ProcessSet(ranks)
    if rank() not in ps.ranks:
        raise exceptions.InvalidArgumentError(
            "add_process_set_among_members(%s): rank %d is not a member; only members call it"
            % (ps.ranks, rank())
        )
    bad = [r for r in ps.ranks if r < 0 or r >= size()]
    if bad:
        raise exceptions.InvalidArgumentError(
            "process set ranks %r must be ranks in [0, %d)" % (ps.ranks, size())
        )
    code, message, set_id = _core.add_process_set(ps.ranks, True)
    exceptions.raise_for_status(code, message)
    ps.process_set_id = set_id
    _registry[set_id] = ps
    _addon_ids.add(set_id)
    return ps


def remove_process_set_among_members(process_set):
    """Unregisters a set registered by add_process_set_among_members, calling on its members only
    (the other ranks take no part, as for the add). Every member must call it, after its last
    operation on the set and in the same order relative to its other removals and collectives
    (torch's destroy_process_group gives that order). Blocks until every member has called it; a
    member that never does fails the others' call after HVDLITE_STALL_SHUTDOWN_TIME_SECONDS with
    a TimeoutError naming the set, its members and the missing ranks. Returns True if it was
    registered (False: already removed, or the global set)."""
    set_id = process_set.process_set_id
    if set_id in (None, 0):
        return False
    if rank() not in process_set.ranks:
        raise exceptions.InvalidArgumentError(
            "remove_process_set_among_members(%s): rank %d is not a member; only members call it"
            % (process_set.ranks, rank())
        )
    code, message = _core.remove_process_set(set_id, True)
    exceptions.raise_for_status(code, message)
    _registry.pop(set_id, None)
    _addon_ids.discard(set_id)
    process_set.process_set_id = None
    return True


def core_set_ids():
    """Ids of the sets in the core's table on this rank, 0 included (rank 0's table also holds
    the sets it coordinates for other ranks); None before init. For checking that removed sets
    are gone."""
    return _core.process_set_ids()


def _registered_as(ranks):
    """Ids of the registered sets with exactly `ranks` (the global set included), leaving out the
    add-ons' own sets (_addon_ids)."""
    return [i for i, r in ids_and_ranks().items() if r == ranks and i not in _addon_ids]


def _add_comm_process_set(ps, allow_duplicate=False):
    """ProcessSet(comm) where comm may differ per rank (e.g. COMM_WORLD.Split(color)), as in
    Horovod: every distinct member list any rank brings is registered, in the same order on
    every rank; `ps` gets the id of its own. (Horovod gives all the parts one id; here each
    part has its own id, and remove_process_set(ps) removes them all.) A part with the ranks of
    a registered set is a duplicate (InvalidArgumentError, on every rank alike: the parts are
    gathered), unless allow_duplicate."""
    tag = "__comm_process_set__.%d" % len(_registry)
    lengths = _allgather_ints([len(ps.ranks)], tag + ".n")
    flat = _allgather_ints(ps.ranks, tag + ".ranks")
    holders: dict[tuple[int, ...], list[int]] = {}  # member list -> the ranks whose comm has it
    groups, start = [], 0
    for holder, n in enumerate(lengths):
        group = flat[start : start + n]
        start += n
        if group not in groups:
            groups.append(group)
        holders.setdefault(tuple(group), []).append(holder)
    duplicates = [] if allow_duplicate else [(g, _registered_as(g)) for g in groups if _registered_as(g)]
    if duplicates:
        raise exceptions.InvalidArgumentError(
            "add_process_set(ProcessSet(comm)): %s, as in Horovod; register each distinct "
            "communicator once"
            % "; ".join(
                "the communicator of rank(s) %s has ranks %s, a duplicate of the registered process set %d"
                % (holders[tuple(g)], g, ids[0])
                for g, ids in duplicates
            )
        )
    ids = []
    for group in groups:
        code, message, set_id = _core.add_process_set(group)
        exceptions.raise_for_status(code, message)
        ids.append(set_id)
        if group == ps.ranks:
            ps.process_set_id = set_id
    ps._part_ids = ids
    _registry[ps.process_set_id] = ps
    return ps


def _allgather_ints(values, name):
    """Every rank's `values` (a list of ints, any length per rank), concatenated in rank
    order, over the global set. Process sets' own allgather on the core, so that this
    module needs no framework adapter (those depend on process sets)."""
    mine = array.array("q", values)
    core = ops.submit(ops.ALLGATHER, name, mine, dtypes.INT64, (len(mine),))
    try:
        ops.wait(core)
        data = ops.take_output(core)[0]
    finally:
        ops.release(core)
    return [] if data is None else array.array("q", data.tobytes()).tolist()


def ids_and_ranks():
    """{process set id: member ranks} of every registered set, the global set (0) included
    (Horovod's internal _get_process_set_ids_and_ranks())."""
    out = {0: global_process_set.ranks}
    for ps in _registry.values():
        for set_id in ps._part_ids or [ps.process_set_id]:
            out[set_id] = _core.process_set_ranks(set_id) or []
    return dict(sorted(out.items()))


def register_static(process_sets):
    """init(process_sets=...): registers the sets in order after checking, from every rank's
    list (gathered), that all ranks gave the same sets (a set's rank order does not matter) and
    that none repeats another or the global set. Otherwise raises InvalidArgumentError (a
    ValueError) on every rank alike, naming the sets, with none of them registered.
    Sets of an MPI communicator may differ per rank and are not compared (add_process_set)."""
    sets = [p if isinstance(p, ProcessSet) else ProcessSet(p) for p in process_sets]
    # One entry per set: [1] + ranks for a communicator's (its ranks may differ per rank), else [0] + ranks.
    every = _allgather_lists(
        [[int(p.mpi_comm is not None)] + p.ranks for p in sets], "__static_process_sets__"
    )
    shown = [[e[1:] if e[0] == 0 else "<communicator>" for e in theirs] for theirs in every]
    differ = [r for r, theirs in enumerate(shown) if theirs != shown[0]]
    if differ:
        raise exceptions.InvalidArgumentError(
            "hvd.init(process_sets=...): every rank must give the same process sets; rank 0 gave "
            "%s, but %s" % (shown[0], "; ".join("rank %d gave %s" % (r, shown[r]) for r in differ))
        )
    seen = [global_process_set.ranks]
    for i in range(len(sets)):
        for ranks in _parts(every, i):
            if ranks in seen:
                what = "the global process set" if ranks == seen[0] else "an earlier entry"
                raise exceptions.InvalidArgumentError(
                    "hvd.init(process_sets=...): entry %d, ProcessSet(%s), is a duplicate of %s"
                    % (i, ranks, what)
                )
            seen.append(ranks)
    added = []
    try:
        for p in sets:
            added.append(add_process_set(p))
    except exceptions.InvalidArgumentError:  # raised alike on every rank: undo them all
        for p in added:
            remove_process_set(p)
        raise


def _parts(every, i):
    """The distinct member lists entry i stands for across the ranks, in rank order (one for a
    set of ranks; one per distinct communicator for a set of communicators)."""
    out = []
    for theirs in every:
        if theirs[i][1:] not in out:
            out.append(theirs[i][1:])
    return out


def _allgather_lists(lists, tag):
    """Every rank's list of int lists, in rank order (one entry per rank)."""
    flat = [len(lists)] + [x for one in lists for x in [len(one)] + one]
    lengths = _allgather_ints([len(flat)], tag + ".n")
    data = _allgather_ints(flat, tag + ".data")
    out, start = [], 0
    for n in lengths:
        enc, start = data[start : start + n], start + n
        lists_of_rank, pos = [], 1
        for _ in range(enc[0]):
            lists_of_rank.append(enc[pos + 1 : pos + 1 + enc[pos]])
            pos += 1 + enc[pos]
        out.append(lists_of_rank)
    return out


def remove_process_set(process_set):
    """Unregisters a process set on every rank (collective). Returns True if
    it was registered."""
    if process_set.process_set_id in (None, 0):
        return False
    for set_id in getattr(process_set, "_part_ids", None) or [process_set.process_set_id]:
        code, message = _core.remove_process_set(set_id)
        exceptions.raise_for_status(code, message)
    _registry.pop(process_set.process_set_id, None)
    _addon_ids.discard(process_set.process_set_id)
    process_set.process_set_id = None
    process_set._part_ids = None
    return True


def resolve(process_set):
    """The core id of `process_set`, checking that it is registered."""
    if process_set is None:
        return 0
    process_set._require_registered()
    return process_set.process_set_id
