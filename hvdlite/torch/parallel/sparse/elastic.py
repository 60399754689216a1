"""Elastic training with sharded tables: rejoin(), what ShardedEmbeddingCollection.rejoin() runs
at the start of every (re)entry of an hvd.elastic.run function (docs/sparse.md, "Elastic").

When a rank dies, hvd.elastic.run re-forms the job in-process: the survivors keep their memory,
so a server keeps its shards and their optimizer state, but the ranks are renumbered and the
old process set, layouts and exchange name positions of a world that is gone. rejoin() is a
collective over the new world (the global process set) that
  1. allgathers each process's claim: the slot of the holders it held in the last world it
     joined (None for a worker), and whether it had joined one (False for a process the driver
     started into this generation, which becomes a worker whatever its rank says);
  2. checks that every holder slot survived; a lost slot is an error on every rank naming the
     server's rank in the last world (its rows and optimizer state died with it; a checkpoint,
     hvd.parallel.load_sparse_checkpoint, is the way back) -- not an HvdliteInternalError, so
     elastic.run does not retry it forever;
  3. rebuilds the layouts over the new positions (slot order kept, so each server holds the same
     rows it held), the exchange (averaging over the new number of workers) and keeps the
     shards, their optimizer state, the gradients the staleness bound holds back and the
     traffic counters. Gradients in flight at the failure are dropped with their collective.

With replicas (replicate=True) step 2 does not fail for a server whose buddy survives: the
claims also carry the committed table steps and how far each copy can be rolled back, and
recover.py rolls every copy back, rebuilds lost servers' rows from their buddies and re-forms
the ring of buddies.

Without servers every rank holds a shard, so a world that lost or gained a rank cannot go on
(the error names what changed); a world of the same ranks rejoins as is.
Blocking: one allgather_object over the new world. Not thread-safe (the training thread only).
"""

import dataclasses

import torch

from hvdlite.common import exceptions
from hvdlite.common.objects import allgather_object
from hvdlite.common.process_sets import global_process_set
from hvdlite.common.topology import cross_rank
from hvdlite.parallel.sparse import TableLayout
from hvdlite.torch.parallel.sparse import recover
from hvdlite.torch.parallel.sparse.exchange import Exchange
from hvdlite.torch.parallel.sparse.optim import RowOptimizer


@dataclasses.dataclass
class Claim:
    """What one process tells the others at rejoin()."""

    slot: int | None  # its slot among the holders in the last world it joined; None: a worker
    joined: bool  # whether it joined a world of these tables before (False: started anew)
    # with replicas (replicate=True; recover.py): the host it runs on (cross_rank), the
    # committed table steps it was given, the steps its own shard and its replica can be
    # rolled to ((oldest, newest) or None) and the slot its replica copies
    host: int = 0
    committed: int | None = None
    own_reach: tuple[int, int] | None = None
    ward: int | None = None
    ward_reach: tuple[int, int] | None = None


def rejoin(coll, committed_steps=None):
    """Re-forms `coll` (a ShardedEmbeddingCollection over the global set) over the current world;
    see the module docstring. Returns the global ranks of the workers."""
    ps = global_process_set
    if coll.process_set is not ps:
        raise exceptions.NotSupportedError(
            "%s: rejoin() re-forms tables over the whole job; build them with process_set=None" % coll.name
        )
    claims = allgather_object(_my_claim(coll, committed_steps))
    old_holders = coll.holders if coll.holders is not None else tuple(range(coll.last_members))
    if coll.replicas is not None:
        positions, lost = _claimed_positions(coll, claims, len(old_holders))
        holders = recover.rejoin_replicated(coll, claims, positions, lost, old_holders)
        return _rebuild_exchange(coll, claims, holders)
    positions = _slot_positions(coll, claims, len(old_holders))
    members = len(claims)
    holders = tuple(positions[s] for s in range(len(old_holders)))
    if coll.holders is None and (members != len(old_holders) or holders != old_holders):
        raise exceptions.PreconditionError(
            "%s: the job changed from %d to %d ranks but its tables are sharded over every rank (no "
            "servers): a lost rank's rows are gone; use the parameter-server mode (servers=...) for "
            "elastic training, or restart from hvd.parallel.load_sparse_checkpoint"
            % (coll.name, len(old_holders), members)
        )
    me = ps.rank()
    fresh = not coll.joined and any(c.joined for c in claims)
    coll.layouts = {n: _moved(lay, members, holders, old_holders) for n, lay in coll.layouts.items()}
    if coll.holders is not None:
        coll.holders = holders
        if fresh and coll.is_server:  # started anew into this world with a server's rank
            _drop_shards(coll, me)
        coll.is_server = me in holders
    return _rebuild_exchange(coll, claims, holders)


def _rebuild_exchange(coll, claims, holders):
    """A new exchange over the current world, holder slots at `holders`; returns the workers."""
    ps = global_process_set
    members = len(claims)
    old = coll.exchange
    old.unsent = None  # gradients of the last world's step (settle() sent any committed ones)
    coll.exchange = Exchange(
        list(coll.specs),
        [coll.layouts[n] for n in coll.specs],
        coll._shard_list(),
        [coll.optimizers[n] for n in coll.specs],
        ps,
        coll.name,
        average_over=members - len(coll.holders or ()),
        staleness=old.staleness,
    )
    coll.exchange.pending, coll.exchange.traffic = old.pending, old.traffic
    coll.exchange.replica = coll.replicas
    coll.joined, coll.last_members = True, members
    coll.last_holder_ranks = [ps.ranks[p] for p in holders]
    return [ps.ranks[p] for p in range(members) if p not in (coll.holders or ())]


def _my_claim(coll, committed):
    """This process's Claim: its position in the world its exchange was built for (the last one
    it joined, or the one it was built in) among that world's holders."""
    me = coll.exchange.me
    holders = list(coll.holders if coll.holders is not None else range(coll.last_members))
    claim = Claim(holders.index(me) if me in holders else None, coll.joined)
    rep = coll.replicas
    if rep is not None:
        claim.host, claim.committed = cross_rank(), committed
        claim.own_reach = rep.own.reach() if rep.own is not None else None
        claim.ward = rep.ward
        claim.ward_reach = rep.replica.reach() if rep.replica is not None else None
    return claim


def _claimed_positions(coll, claims, slots):
    """({holder slot: its position in the new world}, [lost slots]). Processes started anew
    claim nothing when any process had joined before (they were not in the last world)."""
    veterans = any(c.joined for c in claims)
    positions: dict[int, int] = {}
    for pos, c in enumerate(claims):
        if c.slot is None or (veterans and not c.joined):
            continue
        if c.slot in positions:
            raise exceptions.PreconditionError(
                "%s: ranks %d and %d both claim holder slot %d" % (coll.name, positions[c.slot], pos, c.slot)
            )
        positions[c.slot] = pos
    return positions, [s for s in range(slots) if s not in positions]


def _slot_positions(coll, claims, slots):
    """{holder slot: its position in the new world}; a lost slot is an error (no replicas)."""
    positions, lost = _claimed_positions(coll, claims, slots)
    if lost:
        last = coll.last_holder_ranks
        raise exceptions.PreconditionError(
            "%s: %s %s of the last world died with %s shards and optimizer state; the tables "
            "cannot go on without them: restart the job from a checkpoint "
            "(hvd.parallel.save_sparse_checkpoint / load_sparse_checkpoint)"
            % (
                coll.name,
                "server rank(s)" if coll.holders is not None else "rank(s)",
                [last[s] for s in lost],
                "its" if len(lost) == 1 else "their",
            )
        )
    return positions


def _moved(layout, members, holders, old_holders):
    """`layout` over a world of `members` whose holder slots now sit at `holders`."""
    owner = holders[old_holders.index(layout.owner)] if layout.sharding == "table" else 0
    return TableLayout(
        layout.rows,
        layout.dim,
        layout.sharding,
        members,
        owner,
        None if layout.holders is None else holders,
    )


def _drop_shards(coll, me):
    """A process started into a later world with a server's rank holds nothing: it is a worker."""
    for n in coll.specs:
        old = getattr(coll.shards, n)
        empty = torch.zeros(coll.layouts[n].shard_shape(me), dtype=old.dtype, device=old.device)
        setattr(coll.shards, n, empty)
        opt = coll.optimizers[n]
        coll.optimizers[n] = RowOptimizer(opt.kind, empty, opt.lr, **opt.options)
