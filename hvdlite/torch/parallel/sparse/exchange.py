"""The lookup and gradient exchange of sharded embedding tables (hvd.parallel.ShardedEmbedding*).

One step, for all tables of a collection at once, on every member of the process set:
  forward   each member deduplicates its ids (sparse.py: one torch.unique over all tables), and
            sends each unique id once to each member that holds part of its row (one alltoall
            of int64 keys, key = table base + id, with the last backward's gradients). Each holder looks the rows up in its shard and sends them back
            (one alltoall of fp32, flat, so tables of different widths and column slices share
            it). The requester assembles a (unique ids x dim) matrix per table.
  backward  the gradient of those matrices (autograd summed duplicate ids already) goes back
            along the same path; each holder sums the rows every requester sent for one id,
            divides by the set size (the average DistributedOptimizer takes), and its
            RowOptimizer updates them in place. The gradients ride the next forward's ids
            message (one alltoall carries both, so a step is two dependent alltoalls, not three);
            settle() sends them alone when something must see the tables first. With servers
            (parameter-server mode) every backward sends its gradients alone, at once. Row-wise Adagrad on a column-sharded table
            adds one allreduce of one float per touched row (the row's mean square spans
            members).
So per step a member sends its unique ids (8 bytes each, times the holders of a column-sharded
table) and unique ids x dim x 4 bytes twice (rows back, gradients out), and nothing else.

The exchange runs on CPU tensors (the core's alltoall takes host memory); shards and their
optimizer state may live on a CUDA device, and rows and gradients are copied across at the
holder (lookup, update) and at the requester (the rows returned, the gradients sent).
Every call is a collective over the set: every member must run forward and backward of the
same collection in the same order (a member with no ids sends nothing but still takes part).
Each exchange blocks until it completes; a missing member is found by the core's stall check,
and a member whose backward ran when another's did not is an error naming both (the ids
message says how many gradient elements it carries).
"""

import itertools
from collections import deque

import torch

from hvdlite.common import dtypes, exceptions
from hvdlite.torch import mpi_ops
from hvdlite.torch.conjugate import exchange

# one step's updates held back by the staleness bound: ([(table, rows, gradient rows)],
# {table: mean square of each full row}, for row-wise Adagrad on column-sharded tables)
Pending = tuple[list[tuple[int, torch.Tensor, torch.Tensor]], dict[int, torch.Tensor]]
STOP = -2  # the key every member sends every member to end the step loop (Exchange.stop)
_EMPTY_F32 = torch.zeros(0, dtype=torch.float32)


class Traffic:
    """Bytes this member handed to the exchanges for other members (its own part never leaves
    it), counted from the splits of every alltoall/allreduce the collection ran."""

    def __init__(self):
        self.id_bytes = self.row_bytes = self.other_bytes = self.steps = 0
        self.replica_bytes = 0  # a server's rows sent to its buddy (replicate=True)

    def as_dict(self):
        return dict(vars(self))


def _sent_elsewhere(splits, me, itemsize):
    return (sum(splits) - splits[me]) * itemsize


class Step:
    """What a forward remembers for its backward: on the requester side, per (table, member),
    which unique ids went where; on the holder side, the received keys' rows and positions."""

    def __init__(self):
        self.sent = []  # per member: [(table, index into that table's unique ids)]
        self.row_splits = None  # flat fp32 elements this member received from each member
        self.held = []  # per table: (local rows, flat positions of their elements) or None
        self.served_splits = None  # flat fp32 elements this member sent each member
        self.bad_id = None  # (table, id, rows) of an id outside its table on this member
        self.order = None  # keyed lookups: the position of each key sent among the unique keys
        self.got_keys = None  # the keys this member served, in the order received


class Exchange:
    """The exchange of one collection. `tables`: the tables' names; `layouts`: one TableLayout each; `shards`: this
    member's shard of each (rows x columns, updated in place); `optimizers`: one RowOptimizer
    per table; `ps`: the process set; `name`: the collectives' name prefix, the same on every
    member and unique among the collections of the job; `average_over`: the number of members
    whose gradients are averaged (default all; the workers in the parameter-server mode);
    `staleness`: how many steps the holders hold received gradients before applying them (0:
    a step's rows reflect every earlier step's gradients; k: all but the last k)."""

    def __init__(self, tables, layouts, shards, optimizers, ps, name, average_over=None, staleness=0):
        self.tables, self.layouts, self.shards, self.optimizers = tables, layouts, shards, optimizers
        self.ps, self.name = ps, name
        self.members, self.me = len(ps.ranks), ps.rank()
        self.average_over = average_over or self.members
        self.staleness = int(staleness)
        # (flat gradient elements, Step) of the last backward, not yet sent: the next lookup's
        # ids message carries them (or settle() sends them alone)
        self.unsent = None
        # With servers, gradients go in the backward that made them, alone: a server's serve()
        # loop cannot know whether the workers' next call is a lookup or a settle() (elastic
        # commits), so both sides send every step's gradients at the same point.
        self.eager = any(lay.holders is not None for lay in layouts)
        # per table, per member: the rows and columns it holds, and who holds anything
        self.rows = [[lay.row_range(m) for m in range(self.members)] for lay in layouts]
        self.cols = [[lay.col_range(m) for m in range(self.members)] for lay in layouts]
        self.serving = [lay.serving_members() for lay in layouts]
        self.pending: deque[Pending] = deque()
        bases, total = [], 0
        for layout in layouts:
            bases.append(total)
            total += layout.rows
        self.bases, self.base_list = torch.tensor(bases, dtype=torch.int64), bases
        self.table_rows = torch.tensor([lay.rows for lay in layouts], dtype=torch.int64)
        self.widths = torch.tensor([lay.col_range(self.me)[1] - lay.col_range(self.me)[0] for lay in layouts])
        self.row_starts = torch.tensor([lay.row_range(self.me)[0] for lay in layouts], dtype=torch.int64)
        self.local_bases = self.bases + self.row_starts  # key - local_bases[table]: the shard's row
        widths = [int(w) for w in self.widths]
        # the one width of every table this member holds (None when they differ: column shards):
        # then served rows go by row index into a (keys x width) matrix, else by element
        held_widths = {w for w, lay in zip(widths, layouts) if lay.shard_shape(self.me)[0]}
        self.row_width = held_widths.pop() if len(held_widths) == 1 else None
        self.columns = [torch.arange(w) for w in widths]
        self.key_starts, self.key_owners = _key_intervals(layouts, bases)
        # what a table not touched this step updates with (Adam still counts the step)
        self.untouched = [(torch.zeros(0, dtype=torch.int64), torch.zeros(0, w)) for w in widths]
        self.traffic = Traffic()
        # the servers' replicas (replica.Replicas, replicate=True): told of every update before
        # it is applied, and pushed after every step's gradients were applied (eager mode)
        self.replica = None

    # ---- forward -------------------------------------------------------------------------
    def lookup(self, uniques, step):
        """Rows of `uniques` (one sorted unique int64 id tensor per table): a list of
        (len(ids) x dim) fp32 tensors; None when the members stop (stop()). Fills `step` for
        apply_gradients(). Lands the last backward's gradients first (they travel with the ids)."""
        keys, splits = self._requests(uniques, step)
        rows_flat = self._round_trip(keys, splits, step)
        return None if rows_flat is None else self._assemble(uniques, rows_flat, step)

    def keyed(self):
        """Whether lookup_keys() serves these tables: every row has one holder (no column
        sharding) and every table one width, so all tables are one space of keys whose
        holders are contiguous key intervals."""
        return self.key_starts is not None

    def lookup_keys(self, keys, step):
        """Rows of `keys` (sorted unique keys = table base + id, every id inside its table), as
        one (len(keys) x dim) fp32 matrix, by the same messages as lookup() but with no loop
        over tables: each key's holder is its interval's, one stable sort groups the keys by
        holder (in key order within each), and the rows come back in that order. None when
        the members stop."""
        holder = self.key_owners[torch.searchsorted(self.key_starts, keys, right=True) - 1]
        step.order = torch.argsort(holder, stable=True)
        splits = torch.bincount(holder, minlength=self.members).tolist()
        rows_flat = self._round_trip(keys.index_select(0, step.order), splits, step)
        if rows_flat is None:
            return None
        out = torch.empty(keys.numel(), self.layouts[0].dim, dtype=torch.float32)
        out.index_copy_(0, step.order, rows_flat.view(-1, self.layouts[0].dim))
        return out

    def _round_trip(self, keys, splits, step):
        """Sends `keys` (splits[m] of them to member m), serves the keys received and returns
        the flat rows of `keys` (None when the members stop)."""
        got_keys, got = self._send_ids(keys, splits)
        if got_keys.numel() and bool((got_keys == STOP).any()):
            self.flush()
            return None
        self._check_ids(got_keys, got, step)
        flat, step.served_splits = self._serve(got_keys, got, step)
        rows_flat, step.row_splits = exchange(flat, step.served_splits, self.name + ".rows", self.ps)
        self.traffic.row_bytes += _sent_elsewhere(step.served_splits, self.me, 4)
        self.traffic.steps += 1
        return rows_flat

    def stop(self):
        """Ends the step loop of every member: the workers of the parameter-server mode call
        it together, the servers' serve() loops see it and return. Applies what is pending."""
        self._send_ids(torch.full((self.members,), STOP, dtype=torch.int64), [1] * self.members)
        self.flush()

    def _send_ids(self, keys, splits):
        """One alltoall of int32 words: to each member m, [n][n gradient elements (fp32 bits) of
        the unsent backward for m][splits[m] int64 keys]. Lands the gradients received (they
        precede any lookup of the keys) and returns (keys received, keys from each member)."""
        unsent, self.unsent = self.unsent, None
        grads, grad_splits = (unsent[0], unsent[1].row_splits) if unsent else (_EMPTY_F32, [0] * self.members)
        words, word_splits = [], []
        for m, (g, k) in enumerate(zip(torch.split(grads, grad_splits), torch.split(keys, splits))):
            words += [
                torch.tensor([grad_splits[m]], dtype=torch.int32),
                g.view(torch.int32),
                k.view(torch.int32),
            ]
            word_splits.append(1 + grad_splits[m] + 2 * splits[m])
        got_words, got = exchange(torch.cat(words), word_splits, self.name + ".ids", self.ps)
        self.traffic.id_bytes += _sent_elsewhere(splits, self.me, 8)
        self.traffic.row_bytes += _sent_elsewhere(grad_splits, self.me, 4)
        self.traffic.other_bytes += _sent_elsewhere([1] * self.members, self.me, 4)
        expected = unsent[1].served_splits if unsent else [0] * self.members
        grad_parts, key_parts, key_counts = [], [], []
        for m, chunk in enumerate(torch.split(got_words, got)):
            n = int(chunk[0]) if chunk.numel() else -1
            if n != expected[m]:
                self._mismatch(m, n, expected[m])
            grad_parts.append(chunk[1 : 1 + n])
            key_parts.append(chunk[1 + n :])
            key_counts.append((chunk.numel() - 1 - n) // 2)
        if unsent:
            self._land(torch.cat(grad_parts).view(torch.float32), unsent[1])
        return torch.cat(key_parts).view(torch.int64), key_counts

    def _mismatch(self, member, sent, expected):
        raise exceptions.PreconditionError(
            "%s: rank %d sent %d gradient elements with its ids, rank %d expected %d: the members ran "
            "different numbers of backward passes through the tables (every member must run each "
            "forward's backward, or none)"
            % (self.name, self.ps.ranks[member], sent, self.ps.ranks[self.me], expected)
        )

    def flush(self):
        """Applies every gradient still in flight or held back by the staleness bound."""
        self.settle()
        while self.pending:
            self._apply(*self.pending.popleft())

    def _requests(self, uniques, step):
        per_member: list[list[torch.Tensor]] = [[] for _ in range(self.members)]
        step.sent = [[] for _ in range(self.members)]
        for t, (layout, ids) in enumerate(zip(self.layouts, uniques)):
            if ids.numel() and (ids[0] < 0 or ids[-1] >= layout.rows):  # sorted: ends suffice
                step.bad_id = (t, int(ids[0] if ids[0] < 0 else ids[-1]), layout.rows)
            for m in self.serving[t]:
                if layout.sharding == "row":
                    r0, r1 = self.rows[t][m]
                    sel = torch.nonzero((ids >= r0) & (ids < r1)).reshape(-1)
                else:
                    sel = torch.arange(ids.numel())
                if sel.numel():
                    step.sent[m].append((t, sel))
                    per_member[m].append(ids[sel] + int(self.bases[t]))
        if step.bad_id is not None:  # one -1 to every member: all of them learn who, and raise
            return torch.full((self.members,), -1, dtype=torch.int64), [1] * self.members
        splits = [sum(int(k.numel()) for k in keys) for keys in per_member]
        flat = [k for keys in per_member for k in keys]
        keys = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.int64)
        return keys, splits

    def _check_ids(self, keys, got, step):
        """Raises on every member when any member asked for an id outside its table."""
        if keys.numel() == 0 or keys.min() >= 0:
            return
        segments = torch.split(keys, got)
        bad = [self.ps.ranks[r] for r, seg in enumerate(segments) if seg.numel() and seg.min() < 0]
        mine = ""
        if step.bad_id is not None:
            t, bad_id, rows = step.bad_id
            mine = "; here: table %r has %d rows, got id %d" % (self.tables[t], rows, bad_id)
        raise exceptions.InvalidArgumentError(
            "%s: rank(s) %s looked up ids outside their table%s; ids must lie in [0, rows)"
            % (self.name, bad, mine)
        )

    def _serve(self, keys, got, step):
        """The flat rows for the received `keys` (grouped by requester, then by table), and
        how many fp32 elements go back to each requester. The keys are grouped by table with
        one stable sort, so each held table costs one gather and one scatter."""
        step.got_keys = keys
        table = torch.searchsorted(self.bases, keys, right=True) - 1
        width = self.widths[table]
        ends = torch.cumsum(width, 0)
        starts = ends - width
        flat = torch.empty(int(ends[-1]) if keys.numel() else 0, dtype=torch.float32)
        local_rows = keys - self.local_bases[table]
        counts = torch.bincount(table, minlength=len(self.shards)).tolist()
        by_table = torch.split(torch.argsort(table, stable=True), counts)
        step.held = []
        for t, (mine, shard) in enumerate(zip(by_table, self.shards)):
            if not counts[t]:
                step.held.append(None)
                continue
            local = local_rows.index_select(0, mine)
            rows = shard.index_select(0, local.to(shard.device)).cpu()
            if self.row_width is not None:  # every key's rows are one row of a matrix
                flat.view(-1, self.row_width).index_copy_(0, mine, rows)
                step.held.append((local, mine))
            else:
                positions = (starts[mine].unsqueeze(1) + self.columns[t]).reshape(-1)
                flat[positions] = rows.reshape(-1)
                step.held.append((local, positions))
        bounds = torch.cumsum(torch.tensor([0] + got), 0)
        served = [
            int(ends[bounds[r + 1] - 1] - starts[bounds[r]]) if got[r] else 0 for r in range(self.members)
        ]
        return flat, served

    def _assemble(self, uniques, rows_flat, step):
        out = [
            torch.empty(ids.numel(), lay.dim, dtype=torch.float32) for ids, lay in zip(uniques, self.layouts)
        ]
        offset = 0
        for m in range(self.members):
            for t, sel in step.sent[m]:
                c0, c1 = self.cols[t][m]
                n = sel.numel() * (c1 - c0)
                out[t][sel, c0:c1] = rows_flat[offset : offset + n].view(sel.numel(), c1 - c0)
                offset += n
        return out

    # ---- backward ------------------------------------------------------------------------
    def apply_gradients(self, grads, step):
        """Takes the gradient rows (one (unique ids x dim) tensor per table, as lookup()
        returned the rows) for their holders and returns: the next lookup's ids message carries
        them, and the holders average and apply them on receipt; settle() (called by the
        collection's full_weight, checkpoints and stop()) sends them alone. So no exchange of
        its own runs in the backward (with servers, one does: `eager`). A graph holding several
        lookups (two forwards, one backward) settles each one's gradients before the next is
        taken: every backward of a lookup is one optimizer step of the tables."""
        self.settle()
        if step.order is not None:  # lookup_keys: one matrix, rows sent in step.order
            flat = grads[0].index_select(0, step.order).reshape(-1).float()
        else:
            parts = []
            for m in range(self.members):
                for t, sel in step.sent[m]:
                    c0, c1 = self.cols[t][m]
                    parts.append(grads[t][sel, c0:c1].reshape(-1))
            flat = torch.cat(parts).float() if parts else _EMPTY_F32
        self.unsent = (flat.contiguous(), step)
        if self.eager:
            self.settle()
            if self.replica is not None:
                self.replica.push(self)

    def settle(self):
        """Sends the last backward's gradients, if no lookup has carried them yet, and applies
        those received (or holds them back as the staleness bound says). Collective when
        gradients are unsent: every member settles at the same point of its step sequence."""
        if self.unsent is None:
            return
        (flat, step), self.unsent = self.unsent, None
        got, _ = exchange(flat, step.row_splits, self.name + ".grads", self.ps)
        self.traffic.row_bytes += _sent_elsewhere(step.row_splits, self.me, 4)
        self._land(got, step)

    def _land(self, got, step):
        """Sums, averages and applies (or holds back) the gradient elements `got` received for
        the rows this member served in `step`."""
        updates = (
            self._summed_by_key(got, step) if self.row_width is not None else self._summed_by_table(got, step)
        )
        self.pending.append((updates, self._row_square_means(updates)))
        while len(self.pending) > self.staleness:
            self._apply(*self.pending.popleft())

    def _summed_by_key(self, got, step):
        """[(table, shard rows, averaged gradient rows)] when every held table has one width:
        row i of `got` is the gradient of the i-th key served, so one unique over the keys and
        one index_add sum each key's rows over all requesters and tables (keys sort by table)."""
        keys, width, updates = step.got_keys, int(self.row_width or 0), []
        if keys is None or not keys.numel():
            return [(t, *self.untouched[t]) for t in range(len(self.shards))]
        unique, inverse = torch.unique(keys, return_inverse=True)
        g = got.view(-1, width)
        summed = torch.zeros(unique.numel(), width).index_add_(0, inverse, g).div_(self.average_over)
        bounds = torch.searchsorted(unique, self.bases).tolist() + [unique.numel()]
        for t, (a, b) in enumerate(itertools.pairwise(bounds)):
            if a == b:
                updates.append((t, *self.untouched[t]))
            else:
                updates.append((t, unique[a:b] - int(self.local_bases[t]), summed[a:b]))
        return updates

    def _summed_by_table(self, got, step):
        """[(table, shard rows, averaged gradient rows)], table by table (column shards of
        different widths)."""
        updates = []
        for t, held in enumerate(step.held):
            if held is None:
                updates.append((t, *self.untouched[t]))
                continue
            local, index = held  # as _serve placed the rows
            g = got[index].view(local.numel(), -1)
            rows, inverse = torch.unique(local, return_inverse=True)
            summed = torch.zeros(rows.numel(), g.shape[1]).index_add_(0, inverse, g)
            updates.append((t, rows, summed.div_(self.average_over)))
        return updates

    def _apply(self, updates, sq_means):
        if self.replica is not None:
            self.replica.record(updates)
        with torch.no_grad():  # once, not per table: a step updates every table
            for t, rows, g in updates:
                self.optimizers[t].update(rows, g, sq_means.get(t))

    def _row_square_means(self, updates):
        """mean(g**2) over full rows for column-sharded tables whose optimizer needs it: each
        member holds the same touched rows of such a table (every requester sent each id to
        every member), so one allreduce of the partial sums completes them."""
        tables = [
            u
            for u in updates
            if self.layouts[u[0]].sharding == "column" and self.optimizers[u[0]].needs_row_square_sums()
        ]
        if not tables or self.members == 1:
            return {}
        partial = torch.cat([g.pow(2).sum(dim=1) for _, _, g in tables])
        total = _allreduce_sum(partial, self.name + ".sq", self.ps)
        self.traffic.other_bytes += partial.numel() * 4 * 2 * (self.members - 1) // self.members
        out, offset = {}, 0
        for t, rows, _ in tables:
            out[t] = total[offset : offset + rows.numel()] / self.layouts[t].dim
            offset += rows.numel()
        return out


def _key_intervals(layouts, bases):
    """(first key of each interval, its holder), sorted, when every row of every table has one
    holder and all tables one width (then the intervals tile the key space); (None, None)
    otherwise. Table t's rows [r0, r1) on member m are keys [bases[t] + r0, bases[t] + r1)."""
    if any(lay.sharding == "column" for lay in layouts) or len({lay.dim for lay in layouts}) != 1:
        return None, None
    intervals = sorted(
        (base + lay.row_range(m)[0], m) for base, lay in zip(bases, layouts) for m in lay.serving_members()
    )
    starts = torch.tensor([s for s, _ in intervals], dtype=torch.int64)
    return starts, torch.tensor([m for _, m in intervals], dtype=torch.int64)


def _allreduce_sum(t, name, ps):
    return mpi_ops.synchronize(mpi_ops.allreduce_async(t, name=name, op=dtypes.Sum, process_set=ps))


class Lookup(torch.autograd.Function):
    """Autograd node of one step: forward returns the unique rows per table; backward sends
    their gradients to the holders, which update the tables (it returns no gradient: the
    tables are not autograd leaves). `anchor` is a 0-element tensor requiring grad, so the
    node is part of the graph whenever grad mode is on."""

    @staticmethod
    def forward(ctx, anchor, exchange_, uniques):
        step = Step()
        device = uniques[0].device if uniques else torch.device("cpu")
        rows = exchange_.lookup([u.cpu() for u in uniques], step)
        if rows is None:
            raise exceptions.PreconditionError(
                "%s: another worker stopped the servers while this rank still trains" % exchange_.name
            )
        ctx.exchange, ctx.step = exchange_, step
        return tuple(r.to(device) for r in rows)

    @staticmethod
    def backward(ctx, *grads):
        ctx.exchange.apply_gradients([g.cpu().contiguous() for g in grads], ctx.step)
        return None, None, None


class KeyedLookup(Lookup):
    """Lookup of all tables as one space of keys (Exchange.lookup_keys): forward returns one
    (len(keys) x dim) matrix of the rows of `keys`; backward as Lookup's."""

    @staticmethod
    def forward(ctx, anchor, exchange_, keys):
        step = Step()
        rows = exchange_.lookup_keys(keys.cpu(), step)
        if rows is None:
            raise exceptions.PreconditionError(
                "%s: another worker stopped the servers while this rank still trains" % exchange_.name
            )
        ctx.exchange, ctx.step = exchange_, step
        return rows.to(keys.device)
