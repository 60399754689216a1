"""Sharded embedding tables with fused sparse optimizers (hvd.parallel.ShardedEmbeddingBag,
ShardedEmbedding, ShardedEmbeddingCollection). docs/sparse.md is the user page.

Each member of the process set holds its shard of every table (row-, column- or table-wise,
hvdlite/parallel/sparse.py) and the optimizer state of that shard only. A forward
exchanges ids and rows (hvdlite/torch/parallel/sparse/exchange.py); the backward of the loss
sends each touched row's gradient to its holder, which updates it there: the tables are not
parameters (model.parameters() does not list them, DistributedOptimizer never sees them) and
no dense gradient of a table is built. Gradients are averaged over the set, as
DistributedOptimizer averages dense ones, so N members each on 1/N of a batch update a table as
one process on the whole batch would.

Forward and backward are collectives over the set: every member calls them for the same
collection in the same order, also with no ids. The dense module given to from_dense must be
the same on every member (same seed, or broadcast_parameters first).
"""

import collections
import itertools

import torch
import torch.nn.functional as F
from torch import nn

from hvdlite.common import exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.parallel.sparse import TableLayout, plan_tables
from hvdlite.torch import mpi_ops
from hvdlite.torch.parallel.sparse import elastic as sparse_elastic
from hvdlite.torch.parallel.sparse.exchange import Exchange, KeyedLookup, Lookup, Step
from hvdlite.torch.parallel.sparse.optim import RowOptimizer
from hvdlite.torch.parallel.sparse.pool import pool_bags
from hvdlite.torch.parallel.sparse.replica import Replicas, check_replicable, run_on_step

# Default collective names: one counter per process set, so the members of a set, which must
# build the same collections over it in the same order, agree on the names whatever else
# each of them built (a server builds fewer collections than a worker).
_COLLECTION_IDS: "collections.defaultdict[int, itertools.count[int]]" = collections.defaultdict(
    itertools.count
)
INIT_CHUNK_ROWS = 65536  # rows per seeded block of a table initialized without a dense module


class TableSpec:
    """One table of a collection: `rows` x `dim`; `mode` "sum" | "mean" | "max" pools bags
    (nn.EmbeddingBag), None returns rows (nn.Embedding); `weight`: the whole initial table
    (None: N(0, 1) from `seed`, generated block by block so no member builds the whole)."""

    def __init__(self, rows, dim, mode=None, weight=None, include_last_offset=False):
        self.rows, self.dim, self.mode = int(rows), int(dim), mode
        self.weight, self.include_last_offset = weight, include_last_offset

    @classmethod
    def of(cls, table):
        if isinstance(table, TableSpec):
            return table
        if isinstance(table, nn.EmbeddingBag):
            _check_plain(table)
            rows, dim = table.weight.shape
            return cls(rows, dim, table.mode, table.weight.detach(), table.include_last_offset)
        if isinstance(table, nn.Embedding):
            _check_plain(table)
            rows, dim = table.weight.shape
            return cls(rows, dim, None, table.weight.detach())
        rows, dim, *mode = table
        return cls(rows, dim, mode[0] if mode else None)


def _check_plain(module):
    if module.padding_idx is not None or module.max_norm is not None:
        raise exceptions.NotSupportedError(
            "sharded tables do not support padding_idx or max_norm (table %s); drop them or keep "
            "the table dense" % (tuple(module.weight.shape),)
        )


def _initial_shard(spec, layout, member, seed, table_index):
    r0, r1 = layout.row_range(member)
    c0, c1 = layout.col_range(member)
    if spec.weight is not None:  # on the dense module's device
        return spec.weight[r0:r1, c0:c1].to(torch.float32).clone().contiguous()
    blocks = []
    for b in range(r0 // INIT_CHUNK_ROWS, -(-r1 // INIT_CHUNK_ROWS)):
        g = torch.Generator().manual_seed(seed * 1_000_003 + table_index * 65_537 + b)
        lo = b * INIT_CHUNK_ROWS
        block = torch.randn(min(INIT_CHUNK_ROWS, spec.rows - lo), spec.dim, generator=g)
        blocks.append(block[max(r0 - lo, 0) : r1 - lo, c0:c1])
    return torch.cat(blocks).contiguous() if blocks else torch.zeros(0, c1 - c0)


def _layouts(specs, sharding, members, memory_budget, optimizer, holders):
    holding = tuple(range(members)) if holders is None else holders
    if sharding == "auto":
        shapes = {n: (s.rows, s.dim) for n, s in specs.items()}
        plan = plan_tables(shapes, members, memory_budget, optimizer, holders)
        return {n: plan[n] for n in specs}
    if isinstance(sharding, str):
        sharding = {n: sharding for n in specs}
    out = {}
    for i, (n, s) in enumerate(specs.items()):
        choice = sharding[n]
        if isinstance(choice, TableLayout):
            out[n] = choice
        else:  # table sharding without a plan: tables go round-robin over the holders
            out[n] = TableLayout(s.rows, s.dim, choice, members, holding[i % len(holding)], holders)
    return out


class ShardedEmbeddingCollection(nn.Module):
    """Tables {name: nn.Embedding | nn.EmbeddingBag | (rows, dim[, mode]) | TableSpec} sharded
    over `process_set` (None: every rank). `sharding`: "row" | "column" | "table" for all, a
    dict per table (a sharding or a TableLayout), or "auto" (plan_tables with
    `memory_budget` bytes per member). `optimizer`: "sgd" | "adagrad" | "adam", with `lr`
    and that optimizer's options. forward({name: ids or (ids, offsets)}) -> {name: output}.

    Parameter-server mode: `servers` (global ranks, members of the set) hold every table and
    take no batch; they call serve() while the other members, the workers, train, and the
    workers end it with stop_servers() (all of them, at the same step). Gradients are then
    averaged over the workers. `staleness` k: the rows a step reads reflect the gradients of
    every earlier step but the last k (0, the default, is synchronous), in either mode.
    `device`: where the shards and their optimizer state live (default: the dense module's
    device, CPU for tables given by shape); the exchange itself runs through host memory.
    `name`: the prefix of its collectives' names, the same on every member (default: counted
    per process set, so members must build their collections over a set in the same order).
    `replicate`: with servers, each server's shard and optimizer state is copied to a buddy
    server after every step, so that elastic training survives a lost server (replica.py;
    docs/sparse.md)."""

    def __init__(
        self,
        tables,
        sharding="row",
        process_set=None,
        optimizer="sgd",
        lr=0.01,
        memory_budget=None,
        name=None,
        seed=0,
        servers=None,
        staleness=0,
        device=None,
        replicate=False,
        **optimizer_options,
    ):
        super().__init__()
        self.process_set = process_set if process_set is not None else global_process_set
        ps = self.process_set
        if not ps.included():
            raise exceptions.InvalidArgumentError("this rank is not a member of %r" % (ps,))
        self.specs = {str(n): TableSpec.of(t) for n, t in tables.items()}
        for n in self.specs:
            if not n.isidentifier():
                raise exceptions.InvalidArgumentError("table names must be identifiers, got %r" % n)
        self.holders = _server_positions(ps, servers)
        self.is_server = self.holders is not None and ps.rank() in self.holders
        self.layouts = _layouts(self.specs, sharding, len(ps.ranks), memory_budget, optimizer, self.holders)
        if (
            self.holders
            and optimizer == "adagrad"
            and any(v.sharding == "column" for v in self.layouts.values())
        ):
            raise exceptions.NotSupportedError(
                "row-wise Adagrad on a column-sharded table needs every member to hold columns; with "
                "servers, shard by row or table"
            )
        if replicate:
            check_replicable(self.holders, self.layouts, staleness)
        set_id = ps.process_set_id or 0
        self.name = name if name is not None else "sparse%d.%d" % (set_id, next(_COLLECTION_IDS[set_id]))
        self.shards = nn.Module()  # buffers, one per table: in state_dict, not in parameters()
        optimizers = []
        for i, (n, spec) in enumerate(self.specs.items()):
            shard = _initial_shard(spec, self.layouts[n], ps.rank(), seed, i)
            shard = shard if device is None else shard.to(device)
            self.shards.register_buffer(n, shard)
            optimizers.append(RowOptimizer(optimizer, shard, lr, **optimizer_options))
        self.optimizers = dict(zip(self.specs, optimizers))
        self.exchange = Exchange(
            list(self.specs),
            [self.layouts[n] for n in self.specs],
            self._shard_list(),
            optimizers,
            ps,
            self.name,
            average_over=len(ps.ranks) - len(self.holders or ()),
            staleness=staleness,
        )
        self.replicas = Replicas() if replicate else None
        self.exchange.replica = self.replicas
        for spec in self.specs.values():
            spec.weight = None  # the dense initial table is not kept
        # every table a bag of one mode, width and offsets rule: forward pools them all at once
        kinds = {(s.mode, s.dim, s.include_last_offset) for s in self.specs.values()}
        self.pooled_alike = len(kinds) == 1 and next(iter(kinds))[0] is not None
        self.include_last = next(iter(kinds))[2]
        # the last world these tables were formed in (rejoin(), hvdlite/torch/parallel/sparse/elastic.py)
        self.joined, self.last_members = False, len(ps.ranks)
        self.last_holder_ranks = [ps.ranks[p] for p in (self.holders or range(len(ps.ranks)))]

    def _shard_list(self):
        return [getattr(self.shards, n) for n in self.specs]

    @classmethod
    def from_dense(cls, tables, sharding="row", process_set=None, optimizer="sgd", lr=0.01, **kwargs):
        return cls(tables, sharding, process_set, optimizer, lr, **kwargs)

    def serve(self, on_step=None, steps=None):
        """A server's loop (parameter-server mode): answers the workers' lookups and applies
        their gradients until they call stop_servers() (or, given `steps`, for so many steps).
        Returns the number of steps served.
        `on_step()` runs after each step served: the servers' part of whatever collective over
        the whole job the workers run once per step (in elastic training `state.commit`, when the
        workers commit every step; docs/sparse.md)."""
        if not self.is_server:
            raise exceptions.PreconditionError(
                "rank %d is a worker of %s: train, then call stop_servers()"
                % (self.process_set.ranks[self.process_set.rank()], self.name)
            )
        none = [torch.zeros(0, dtype=torch.int64)] * len(self.specs)
        served = 0
        while steps is None or served < steps:
            step = Step()
            if self.exchange.lookup(none, step) is None:
                return served
            self.exchange.apply_gradients([torch.zeros(0, s.dim) for s in self.specs.values()], step)
            served += 1
            run_on_step(self.replicas, on_step)
        return served

    def stop_servers(self):
        """Ends the servers' serve() loops (every worker calls it, at the same step); applies
        gradients still held back by the staleness bound."""
        self.exchange.stop()

    def settle(self):
        """Waits for the last backward's gradients to reach their holders (and, on a holder, applies
        them as the staleness bound allows). Call it before an elastic state.commit(), so that a
        committed step's rows have left this rank."""
        self.exchange.settle()

    def rejoin(self, committed_steps=None):
        """Re-forms the tables over the current world of an elastic job, keeping every surviving
        server's shards and optimizer state (collective over the job; call it first thing in the
        function hvd.elastic.run runs, every rank). Returns the workers' global ranks (every rank
        without servers). A dead server is an error naming its rank, unless the tables keep
        replicas (replicate=True): then every rank passes `committed_steps`, the table steps the
        elastic state committed, a lost server's rows come back from its buddy and every server
        rolls back to that step. See elastic.py and recover.py."""
        return sparse_elastic.rejoin(self, committed_steps)

    def forward(self, inputs):
        if self.is_server:
            raise exceptions.PreconditionError(
                "rank %d is a server of %s: it takes no batch, call serve()"
                % (self.process_set.ranks[self.process_set.rank()], self.name)
            )
        unknown = set(inputs) - set(self.specs)
        if unknown or len(inputs) != len(self.specs):
            raise exceptions.InvalidArgumentError(
                "%s takes ids for every table %s, got %s" % (self.name, sorted(self.specs), sorted(inputs))
            )
        parsed = [_parse(n, spec, inputs[n]) for n, spec in self.specs.items()]
        pool_all = self.pooled_alike and all(weights is None for _, _, weights in parsed)
        keyed = self.exchange.keyed()
        keys, uniques, inverse, per_table = _unique_ids(parsed, self.exchange, not (keyed and pool_all))
        anchor = torch.zeros(0, requires_grad=torch.is_grad_enabled())
        if keys is not None and keyed:  # one matrix of every table's rows
            every = KeyedLookup.apply(anchor, self.exchange, keys)
            if pool_all:
                return self._pool_all(parsed, inverse, every)
            rows = torch.split(every, [u.numel() for u in uniques])
        else:
            rows = Lookup.apply(anchor, self.exchange, list(uniques))
            if pool_all:
                return self._pool_all(parsed, inverse, torch.cat(rows))
        out = {}
        for (n, spec), (ids, offsets, weights), inv, r in zip(self.specs.items(), parsed, per_table, rows):
            inv = inv.view(ids.shape)
            if spec.mode is None:
                out[n] = r[inv]
            else:
                out[n] = F.embedding_bag(
                    inv,
                    r,
                    offsets,
                    mode=spec.mode,
                    per_sample_weights=weights,
                    include_last_offset=spec.include_last_offset,
                )
        return out

    def _pool_all(self, parsed, inverse, rows):
        """Every table's bags by one embedding_bag over `rows`, the rows of all tables stacked
        (the ids' positions in them are `inverse`), as FBGEMM's table-batched kernel pools: one
        op forward and one backward instead of one per table. Same sums, in the same order."""
        offsets, counts, start = [], [], 0
        for ids, given, _ in parsed:
            if given is None:  # 2-D ids: one bag per row
                given = torch.arange(ids.shape[0]) * ids.shape[1]
            elif self.include_last:
                given = given[:-1]
            offsets.append(given + start)
            counts.append(given.numel())
            start += ids.numel()
        mode = next(iter(self.specs.values())).mode
        pooled = pool_bags(inverse, rows, torch.cat(offsets), mode)
        return dict(zip(self.specs, torch.split(pooled, counts)))

    def full_weight(self, table):
        """Table `table` whole, gathered from its holders (a collective over the set), with the
        last backward's gradients applied."""
        self.exchange.settle()
        layout, shard = self.layouts[table], getattr(self.shards, table)
        flat = mpi_ops.synchronize(
            mpi_ops.allgather_async(
                shard.reshape(-1).cpu(), name="%s.full.%s" % (self.name, table), process_set=self.process_set
            )
        )
        whole, offset = torch.empty(layout.rows, layout.dim), 0
        for m in range(layout.members):
            (r0, r1), (c0, c1) = layout.row_range(m), layout.col_range(m)
            n = (r1 - r0) * (c1 - c0)
            whole[r0:r1, c0:c1] = flat[offset : offset + n].view(r1 - r0, c1 - c0)
            offset += n
        return whole.to(shard.device)

    def memory_bytes(self):
        """{"table": bytes of this member's shards, "optimizer": bytes of their state}."""
        table = sum(s.numel() * s.element_size() for s in self._shard_list())
        return {"table": table, "optimizer": sum(o.state_bytes() for o in self.optimizers.values())}

    def traffic(self):
        """Bytes this member sent to other members since construction (ids, rows and
        gradients, other), and the number of forward steps."""
        return self.exchange.traffic.as_dict()


def _server_positions(ps, servers):
    """The servers' positions in `ps` (sorted), or None when there are no servers."""
    if servers is None:
        return None
    ranks = servers.ranks if hasattr(servers, "ranks") else [int(r) for r in servers]
    outside = [r for r in ranks if r not in ps.ranks]
    if outside or not ranks or len(ranks) >= len(ps.ranks):
        raise exceptions.InvalidArgumentError(
            "servers %s must be some, not all, of the set's ranks %s" % (sorted(ranks), ps.ranks)
        )
    return tuple(sorted(ps.ranks.index(r) for r in ranks))


def _unique_ids(parsed, exchange_, per_table=True):
    """(sorted unique keys of all tables, sorted unique ids per table, every id's position in
    the keys, the same per table as a position in its own uniques) by one torch.unique over
    all tables (an id's key is its table's base + id); without `per_table` the two per-table
    lists are None. Ids outside their table take one unique per table instead, and no keys
    (None), so that the exchange reports them on every member."""
    flat = [ids.reshape(-1) for ids, _, _ in parsed]
    counts = [f.numel() for f in flat]
    if not flat:
        return None, [], torch.zeros(0, dtype=torch.int64), []
    ids = torch.cat(flat)
    table = torch.repeat_interleave(torch.arange(len(flat)), torch.tensor(counts))
    if bool(((ids < 0) | (ids >= exchange_.table_rows[table])).any()):
        pairs = [torch.unique(f, return_inverse=True) for f in flat]
        shift = torch.tensor([0] + [u.numel() for u, _ in pairs]).cumsum(0)[:-1]
        inverses = [inv for _, inv in pairs]
        return None, [u for u, _ in pairs], torch.cat(inverses) + shift[table], inverses
    keys, inverse = torch.unique(ids + exchange_.bases[table], return_inverse=True)
    if not per_table:
        return keys, None, inverse, None
    bounds = torch.searchsorted(keys, exchange_.bases).tolist() + [keys.numel()]
    uniques = [keys[a:b] - base for a, b, base in zip(bounds, bounds[1:], exchange_.base_list)]
    per_table = [inv - bounds[t] for t, inv in enumerate(torch.split(inverse, counts))]
    return keys, uniques, inverse, per_table


def _parse(name, spec, given):
    """(ids, offsets, per_sample_weights) of one table's input, as nn.Embedding(Bag) takes it."""
    offsets = weights = None
    if isinstance(given, (tuple, list)):
        ids, offsets, *rest = given
        weights = rest[0] if rest else None
    else:
        ids = given
    ids = torch.as_tensor(ids).to(torch.int64)
    if spec.mode is not None and offsets is None and ids.dim() != 2:
        raise exceptions.InvalidArgumentError(
            "table %r pools bags: pass (ids, offsets) or a 2-D ids tensor, got ids of shape %s"
            % (name, tuple(ids.shape))
        )
    if offsets is not None:
        offsets = torch.as_tensor(offsets).to(torch.int64)
    return ids, offsets, weights


class _OneTable(nn.Module):
    """A collection of one table named "weight", the base of the single-table modules."""

    _MODE = None

    def __init__(
        self,
        num_embeddings,
        embedding_dim,
        mode=None,
        sharding="row",
        process_set=None,
        optimizer="sgd",
        lr=0.01,
        weight=None,
        include_last_offset=False,
        **kwargs,
    ):
        super().__init__()
        spec = TableSpec(num_embeddings, embedding_dim, mode, weight, include_last_offset)
        self.tables = ShardedEmbeddingCollection(
            {"weight": spec}, sharding, process_set, optimizer, lr, **kwargs
        )
        self.num_embeddings, self.embedding_dim = spec.rows, spec.dim

    @classmethod
    def from_dense(cls, module, sharding="row", process_set=None, optimizer="sgd", lr=0.01, **kwargs):
        """The sharded twin of a dense nn.EmbeddingBag / nn.Embedding, starting from its weight."""
        spec = TableSpec.of(module)
        return cls(
            spec.rows,
            spec.dim,
            sharding=sharding,
            process_set=process_set,
            optimizer=optimizer,
            lr=lr,
            weight=spec.weight,
            **cls._dense_kwargs(spec),
            **kwargs,
        )

    @staticmethod
    def _dense_kwargs(spec):
        """What from_dense passes besides the shape and the weight (the bag's mode and offsets rule)."""
        return {}

    def full_weight(self):
        """The whole table, gathered (a collective over the set)."""
        return self.tables.full_weight("weight")

    def memory_bytes(self):
        return self.tables.memory_bytes()

    @property
    def is_server(self):
        return self.tables.is_server

    def serve(self, on_step=None, steps=None):
        return self.tables.serve(on_step, steps)

    def stop_servers(self):
        self.tables.stop_servers()

    def settle(self):
        self.tables.settle()

    def rejoin(self, committed_steps=None):
        return self.tables.rejoin(committed_steps)

    def traffic(self):
        return self.tables.traffic()

    @property
    def layout(self):
        return self.tables.layouts["weight"]


class ShardedEmbeddingBag(_OneTable):
    """nn.EmbeddingBag sharded over a process set: emb(ids, offsets) returns this rank's bags;
    the backward of a loss over them updates the table's rows on their holders."""

    def __init__(self, num_embeddings, embedding_dim, mode="mean", **kwargs):
        super().__init__(num_embeddings, embedding_dim, mode, **kwargs)

    @staticmethod
    def _dense_kwargs(spec):
        return {"mode": spec.mode, "include_last_offset": spec.include_last_offset}

    def forward(self, input, offsets=None, per_sample_weights=None):
        return self.tables({"weight": (input, offsets, per_sample_weights)})["weight"]


class ShardedEmbedding(_OneTable):
    """nn.Embedding sharded over a process set: emb(ids) returns ids.shape + (dim,)."""

    def __init__(self, num_embeddings, embedding_dim, **kwargs):
        super().__init__(num_embeddings, embedding_dim, None, **kwargs)

    def forward(self, input):
        return self.tables({"weight": input})["weight"]
