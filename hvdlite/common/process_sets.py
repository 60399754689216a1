"""Process sets: subgroups of ranks that run collectives among themselves.

Horovod's API: ``ProcessSet(ranks)``, ``add_process_set``,
``remove_process_set`` and ``global_process_set`` (id 0, every rank).
Adding and removing are collective over the whole job: every rank must make
the same calls in the same order.
"""
from hvdlite import _core
from hvdlite.common import exceptions


class ProcessSet:
    """A set of ranks. ``process_set_id`` is None until the set is registered."""

    def __init__(self, ranks_or_comm):
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator: not in this build
            raise exceptions.NotSupportedError(
                "ProcessSet(comm) needs the MPI backend, which this build of hvdlite lacks; pass a list of ranks")
        self.ranks = sorted(int(r) for r in ranks_or_comm)
        if len(set(self.ranks)) != len(self.ranks):
            raise exceptions.InvalidArgumentError("ProcessSet ranks must be distinct, got %r" % (ranks_or_comm,))
        self.process_set_id = None

    def _require_registered(self):
        if self.process_set_id is None:
            raise exceptions.PreconditionError(
                "process set %r is not registered; call hvd.add_process_set() on every rank first" % (self.ranks,))

    def size(self):
        self._require_registered()
        return len(self.ranks)

    def rank(self):
        """This process's rank within the set, or -1 if it is not a member."""
        self._require_registered()
        from hvdlite.common.basics import rank
        me = rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        return self.rank() >= 0

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks and \
            self.process_set_id == other.process_set_id

    def __hash__(self):
        return hash((tuple(self.ranks), self.process_set_id))

    def __repr__(self):
        return "ProcessSet(process_set_id=%r, ranks=%r)" % (self.process_set_id, self.ranks)


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job; its ranks are read from the core once initialized."""

    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self):
        ranks = _core.process_set_ranks(0)
        if ranks is None:
            raise exceptions.PreconditionError("hvdlite is not initialized; call hvd.init() first")
        return ranks


global_process_set = _GlobalProcessSet()
_registry = {}


def _reset_registry():
    for ps in _registry.values():
        ps.process_set_id = None
    _registry.clear()


def add_process_set(process_set):
    """Registers a ProcessSet (or a list of ranks) on every rank; returns it
    with its id set. Collective: every rank must call it with the same ranks."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise exceptions.PreconditionError("%r is already registered" % (ps,))
    from hvdlite.common.basics import size
    world = size()
    bad = [r for r in ps.ranks if r < 0 or r >= world]
    if bad or not ps.ranks:
        raise exceptions.InvalidArgumentError(
            "process set ranks %r must be a non-empty list of ranks in [0, %d)" % (ps.ranks, world))
    code, message, set_id = _core.add_process_set(ps.ranks)
    exceptions.raise_for_status(code, message)
    ps.process_set_id = set_id
    _registry[set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregisters a process set on every rank (collective). Returns True if
    it was registered."""
    if process_set.process_set_id in (None, 0):
        return False
    code, message = _core.remove_process_set(process_set.process_set_id)
    exceptions.raise_for_status(code, message)
    _registry.pop(process_set.process_set_id, None)
    process_set.process_set_id = None
    return True


def resolve(process_set):
    """The core id of `process_set`, checking that it is registered."""
    if process_set is None:
        return 0
    process_set._require_registered()
    return process_set.process_set_id
