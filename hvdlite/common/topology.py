"""The topology queries (rank, size, local and cross ranks) of the running job.

They depend only on the core, so every module of hvdlite.common may use them
(basics re-exports them; process sets and Adasum need them below basics).
Each raises PreconditionError before init() and after shutdown().
"""

from hvdlite.common import exceptions
from hvdlite.common.native import core as _core

_TOPOLOGY = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")


def _query(index: int) -> int:
    value = int(_core.topology(index))
    if value < 0:
        raise exceptions.PreconditionError(
            "hvdlite is not initialized; call hvd.init() before hvd.%s()" % _TOPOLOGY[index]
        )
    return value


def rank() -> int:
    """This process's rank in the job, 0 to size() - 1. Needs init()."""
    return _query(0)


def size() -> int:
    """The number of ranks in the job. Needs init()."""
    return _query(1)


def local_rank() -> int:
    """This process's rank among the ranks of its host. Needs init()."""
    return _query(2)


def local_size() -> int:
    """The number of ranks on this process's host. Needs init()."""
    return _query(3)


def cross_rank() -> int:
    """The rank of this process's host among the hosts (its index in host order). Needs init()."""
    return _query(4)


def cross_size() -> int:
    """The number of hosts of the job. Needs init()."""
    return _query(5)


def is_homogeneous() -> bool:
    """Horovod's: True when every host runs the same number of ranks. Decided from this rank's
    own topology, with no communication: local_size * cross_size == size holds on every rank of a
    job whose hosts all run local_size ranks, and fails on the last local rank of the smallest host
    of any other job. Exact on one host and on homogeneous jobs; in a heterogeneous job some other
    ranks can still answer True (the core does not hand its host table to Python)."""
    return local_size() * cross_size() == size()
