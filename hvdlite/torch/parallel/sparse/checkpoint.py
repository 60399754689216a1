"""Checkpoints of sharded embedding tables and their optimizer state, saved per member and
resharded on load to another set size or sharding (as ZeRO's are: zero/checkpoint.py, whose
file naming this shares).

A checkpoint is a directory:
  sparse-meta.json             every table (key "<module path>/<table>"): rows, dim, sharding,
                               owner, optimizer and its options; the set size
  sparse-<m>-of-<N>.pt         member m's shards {key: {"weight": rows x cols, "state": {...}}}

Loading computes this member's new block (rows x columns) of each table and copies, from each
old member file whose block overlaps it (memory-mapped, read only where needed), the
overlapping part of the weight and of the optimizer state: Adam's moments by element, row-wise
Adagrad's accumulator by row, Adam's step count as saved. State is restored when the saved
optimizer is the module's; a module with another optimizer starts with fresh state.
"""

import json
import os

import torch

from hvdlite.common import exceptions
from hvdlite.torch import mpi_ops
from hvdlite.torch.parallel.sparse.embedding import ShardedEmbeddingCollection
from hvdlite.torch.parallel.zero.checkpoint_io import shard_file

FORMAT = "hvdlite-sparse-1"
PREFIX = "sparse"


def _collections(module):
    """{module path: collection} of every ShardedEmbeddingCollection in `module`."""
    found = {n: m for n, m in module.named_modules() if isinstance(m, ShardedEmbeddingCollection)}
    if not found:
        raise exceptions.InvalidArgumentError("the module holds no sharded embedding table")
    sets = {tuple(c.process_set.ranks) for c in found.values()}
    if len(sets) != 1:
        raise exceptions.NotSupportedError("sharded tables over different process sets in one checkpoint")
    return found


def _tables(module):
    """[(key, collection, table name)] in a fixed order."""
    return [(f"{path}/{t}", c, t) for path, c in sorted(_collections(module).items()) for t in c.specs]


def save_sparse_checkpoint(path, module):
    """Writes the sharded tables of `module` (a ShardedEmbedding*, or any module holding them)
    and their optimizer state under directory `path`. Collective over the tables' process
    set: every member writes its own file; returns once all files are written."""
    tables = _tables(module)
    ps = tables[0][1].process_set
    for c in _collections(module).values():
        c.exchange.flush()  # the last backward's gradients, and any held back by staleness
    os.makedirs(path, exist_ok=True)
    payload = {}
    for key, c, t in tables:
        opt = c.optimizers[t]
        payload[key] = {"weight": getattr(c.shards, t).detach(), "state": dict(opt.state)}
    torch.save(payload, shard_file(path, ps.rank(), len(ps.ranks), PREFIX))
    if ps.rank() == 0:
        described = {}
        for key, c, t in tables:
            lay, opt = c.layouts[t], c.optimizers[t]
            described[key] = {
                "rows": lay.rows,
                "dim": lay.dim,
                "sharding": lay.sharding,
                "owner": lay.owner,
                "holders": None if lay.holders is None else list(lay.holders),
                "optimizer": opt.kind,
                "options": opt.options,
                "lr": opt.lr,
            }
        meta = {"format": FORMAT, "members": len(ps.ranks), "tables": described}
        with open(os.path.join(path, PREFIX + "-meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
    mpi_ops.barrier(process_set=ps)


class _Saved:
    """The saved layouts and the member files, opened on first use."""

    def __init__(self, path):
        from hvdlite.parallel.sparse import TableLayout

        self.path = path
        meta_file = os.path.join(path, PREFIX + "-meta.json")
        if not os.path.exists(meta_file):
            raise exceptions.InvalidArgumentError(
                "%s holds no sharded-table checkpoint (no %s)" % (path, meta_file)
            )
        with open(meta_file) as f:
            self.meta = json.load(f)
        if self.meta.get("format") != FORMAT:
            raise exceptions.InvalidArgumentError("%s is not an hvdlite sharded-table checkpoint" % path)
        self.members = self.meta["members"]
        self.layouts = {
            k: TableLayout(
                v["rows"], v["dim"], v["sharding"], self.members, v["owner"], _tuple(v.get("holders"))
            )
            for k, v in self.meta["tables"].items()
        }
        self._files = {}

    def file(self, m):
        if m not in self._files:
            self._files[m] = torch.load(
                shard_file(self.path, m, self.members, PREFIX), mmap=True, weights_only=True
            )
        return self._files[m]


def _tuple(holders):
    return None if holders is None else tuple(holders)


def load_sparse_checkpoint(path, module):
    """Loads directory `path` (written by save_sparse_checkpoint at any set size and sharding)
    into the sharded tables of `module`, resharding to their current layouts. Each member reads
    only the files that hold its blocks; collective only when gradients of a backward are still
    in flight (they are applied first)."""
    saved = _Saved(path)
    for c in _collections(module).values():
        c.exchange.settle()  # gradients in flight land before the tables are overwritten
    for key, c, t in _tables(module):
        if key not in saved.layouts:
            raise exceptions.InvalidArgumentError(
                "checkpoint %s has no table %r (it has %s)" % (path, key, sorted(saved.layouts))
            )
        old, new = saved.layouts[key], c.layouts[t]
        if (old.rows, old.dim) != (new.rows, new.dim):
            raise exceptions.InvalidArgumentError(
                "table %r is %d x %d in %s, %d x %d here" % (key, old.rows, old.dim, path, new.rows, new.dim)
            )
        same_optimizer = saved.meta["tables"][key]["optimizer"] == c.optimizers[t].kind
        with torch.no_grad():
            _load_table(
                saved,
                key,
                old,
                new,
                c.process_set.rank(),
                getattr(c.shards, t),
                c.optimizers[t].state if same_optimizer else None,
            )


def _load_table(saved, key, old, new, me, weight, state):
    (r0, r1), (c0, c1) = new.row_range(me), new.col_range(me)
    if state is not None:  # scalars (Adam's step count) are the same on every member
        for name, value in saved.file(0)[key]["state"].items():
            if value.dim() == 0:
                state[name].copy_(value)
    for m in range(old.members):
        (R0, R1), (C0, C1) = old.row_range(m), old.col_range(m)
        lo, hi, left, right = max(r0, R0), min(r1, R1), max(c0, C0), min(c1, C1)
        if lo >= hi or left >= right:
            continue
        part = saved.file(m)[key]
        here = (slice(lo - r0, hi - r0), slice(left - c0, right - c0))
        there = (slice(lo - R0, hi - R0), slice(left - C0, right - C0))
        weight[here] = part["weight"][there]
        if state is None:
            continue
        for name, value in part["state"].items():
            if value.dim() == 2:  # by element (Adam's moments)
                state[name][here] = value[there]
            elif value.dim() == 1:  # by row (row-wise Adagrad)
                state[name][here[0]] = value[there[0]]
