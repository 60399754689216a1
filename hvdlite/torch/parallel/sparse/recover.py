"""rejoin() for tables whose servers keep replicas (ShardedEmbeddingCollection(...,
replicate=True); the copies and their wire format: replica.py). Called by elastic.rejoin with
every process's Claim (one allgather over the job; each decision below depends on the claims
only, so every rank takes the same branch and raises the same errors):

  1. the committed table steps are rank 0's (after hvd.elastic.run's sync every rank holds
     rank 0's state); each holder slot is restored from its server when it survives, else from
     its buddy's replica; a slot with neither is an error naming both ranks;
  2. each copy used is rolled back to the committed step (its undo log), so a step the workers
     redo is applied once;
  3. with no slot lost the layouts move to the new positions and the shards stay where they
     are; with a slot lost, the tables are split again over the surviving servers (the same
     sharding; a table-sharded table goes to its owner or, if that died, to its buddy) and one
     alltoall moves every row (and its optimizer state) from its copy to its new holder;
  4. the ring of buddies is formed again over the servers of the new world and every server
     sends its whole shard to its buddy (one alltoall), which starts a fresh replica.
Blocking: three alltoalls over the job at most (reshard, seed), besides elastic.rejoin's
allgather. Costs the bytes of every shard once per rejoin (the seed), not per step.
"""

import torch

from hvdlite.common import exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.parallel.sparse import TableLayout
from hvdlite.torch.parallel.sparse import replica as rp
from hvdlite.torch.parallel.sparse.optim import RowOptimizer


def rejoin_replicated(coll, claims, positions, lost, old_holders):
    """Restores and re-forms `coll` (see the module docstring); returns the new holders'
    positions, in slot order."""
    ps = global_process_set
    committed = claims[0].committed
    if committed is None:
        raise exceptions.PreconditionError(
            "%s: tables with replicate=True need rejoin(committed_steps) on every rank: the number of "
            "table steps the elastic state has committed (state.step when each training step runs one "
            "forward and backward through the tables)" % coll.name
        )
    sources = _sources(coll, claims, positions, lost, len(old_holders), committed)
    rep, me = coll.replicas, ps.rank()
    for pos, kind in sources.values():
        copy = rep.own if kind == "own" else rep.replica
        if pos == me and copy is not None:
            copy.rollback(committed)
    survivors = [s for s in range(len(old_holders)) if s in positions]
    holders = tuple(positions[s] for s in survivors)
    layouts = {
        n: _layout(lay, len(claims), old_holders, holders, positions, sources)
        for n, lay in coll.layouts.items()
    }
    if lost:
        _reshard(coll, sources, old_holders, layouts, holders)
    elif me not in holders and coll.is_server:  # started anew with a server's rank: a worker
        _set_shards(coll, layouts, me, [])
    coll.layouts, coll.holders, coll.is_server = layouts, holders, me in holders
    _seed(coll, claims, holders, committed)
    return holders


def _sources(coll, claims, positions, lost, slots, committed):
    """{slot: (position of the process holding its copy, "own" | "replica")}; raises when a
    slot has no copy, or its copy cannot be rolled to `committed`."""
    buddy_of = {c.ward: pos for pos, c in enumerate(claims) if c.ward is not None and c.joined}
    both = [s for s in lost if s not in buddy_of]
    last = coll.last_holder_ranks
    if both:
        ring = coll.replicas.ring or {}
        pairs = "; ".join(
            "server rank %d and its buddy, rank %d" % (last[s], last[ring[s]])
            if s in ring
            else "server rank %d (no buddy: the only server left)" % last[s]
            for s in both
        )
        raise exceptions.PreconditionError(
            "%s: %s, died together: the rows and optimizer state they held are gone; restart the job "
            "from the last checkpoint (hvd.parallel.save_sparse_checkpoint / load_sparse_checkpoint)"
            % (coll.name, pairs)
        )
    sources, bad = {}, []
    for s in range(slots):
        pos, kind = (positions[s], "own") if s in positions else (buddy_of[s], "replica")
        sources[s] = (pos, kind)
        reach = claims[pos].own_reach if kind == "own" else claims[pos].ward_reach
        if reach is not None and not reach[0] <= committed <= reach[1]:
            bad.append("server rank %d's rows (%s copy: steps %d..%d)" % (last[s], kind, *reach))
    if bad:
        raise exceptions.PreconditionError(
            "%s: the job committed %d table steps, but %s cannot be brought to that step; restart from "
            "the last checkpoint (hvd.parallel.load_sparse_checkpoint)"
            % (coll.name, committed, ", ".join(bad))
        )
    return sources


def _layout(lay, members, old_holders, holders, positions, sources):
    """`lay` over the new world: the surviving slots at their new positions (with none lost,
    each keeps its rows); a table-sharded table whose owner died goes to its copy's holder."""
    owner = 0
    if lay.sharding == "table":
        slot = old_holders.index(lay.owner)
        owner = positions[slot] if slot in positions else sources[slot][0]
    return TableLayout(lay.rows, lay.dim, lay.sharding, members, owner, holders)


def _copy_of(coll, kind):
    rep = coll.replicas
    if kind == "replica":
        return rep.replica
    return rep.own if rep.own is not None else _live_copy(coll, coll.exchange.me)


def _live_copy(coll, member):
    """This process's live shards as a SlotCopy (its weights and optimizer states, not copied)."""
    names = list(coll.specs)
    return rp.SlotCopy(
        [getattr(coll.shards, n) for n in names],
        [coll.optimizers[n].state for n in names],
        [coll.layouts[n].row_range(member)[0] for n in names],
    )


def _reshard(coll, sources, old_holders, layouts, holders):
    """Moves every row of every slot's copy to its holder under `layouts` (one alltoall)."""
    ps, me = global_process_set, global_process_set.rank()
    blocks: list[list[torch.Tensor]] = [[] for _ in ps.ranks]
    for s, (pos, kind) in sources.items():
        if pos != me:
            continue
        copy = _copy_of(coll, kind)
        for t, n in enumerate(coll.specs):
            a, b = coll.layouts[n].row_range(old_holders[s])
            for q in holders:
                lo, hi = layouts[n].row_range(q)
                lo, hi = max(lo, a), min(hi, b)
                if lo < hi:
                    blocks[q].append(rp.encode(copy, t, torch.arange(lo, hi)))
    got = rp.send_blocks(blocks, ps, coll.name + ".reshard")
    _set_shards(coll, layouts, me, got)


def _fresh(coll, layouts, member, device):
    """Zero shards and fresh optimizer states of `member` under `layouts`, as a SlotCopy."""
    weights, states = [], []
    for n in coll.specs:
        w = torch.zeros(layouts[n].shard_shape(member), dtype=torch.float32, device=device)
        opt = coll.optimizers[n]
        weights.append(w)
        states.append(RowOptimizer(opt.kind, w, opt.lr, **opt.options).state)
    return rp.SlotCopy(weights, states, [layouts[n].row_range(member)[0] for n in coll.specs])


def _set_shards(coll, layouts, me, got):
    """This process's shards under `layouts`, filled from the blocks `got`."""
    device = getattr(coll.shards, next(iter(coll.specs))).device
    copy = _fresh(coll, layouts, me, device)
    for words in got:
        rp.decode_into(copy, words, record=False)
    for (n, w), state in zip(zip(coll.specs, copy.weights), copy.states):
        setattr(coll.shards, n, w)
        opt = coll.optimizers[n]
        coll.optimizers[n] = RowOptimizer(opt.kind, w, opt.lr, **opt.options)
        coll.optimizers[n].state = state
    coll.replicas.own = None  # the old copy's tensors are gone


def _seed(coll, claims, holders, committed):
    """Forms the ring over `holders` and starts every replica from its ward's whole shard."""
    ps, me, rep = global_process_set, global_process_set.rank(), coll.replicas
    ring = rp.ring([claims[q].host for q in holders]) if len(holders) > 1 else {}
    slot = holders.index(me) if me in holders else None
    own = _live_copy(coll, me) if slot is not None else None
    blocks: list[list[torch.Tensor]] = [[] for _ in ps.ranks]
    if own is not None and ring:
        for t, n in enumerate(coll.specs):
            a, b = coll.layouts[n].row_range(me)
            blocks[holders[ring[slot]]].append(rp.encode(own, t, torch.arange(a, b)))
    got = rp.send_blocks(blocks, ps, coll.name + ".seed") if ring else []
    ward = next((w for w, b in ring.items() if b == slot), None) if slot is not None else None
    replica = None
    if ward is not None:
        replica = _fresh(coll, coll.layouts, holders[ward], "cpu")  # in host memory
        rp.decode_into(replica, got[holders[ward]], record=False)
    for copy in (own, replica):
        if copy is not None:
            copy.steps = committed
    rep.ring, rep.slot, rep.ward, rep.own, rep.replica = ring, slot, ward, own, replica
    rep.buddy_pos = holders[ring[slot]] if slot is not None and ring else None
    rep.ward_pos = holders[ward] if ward is not None else None
