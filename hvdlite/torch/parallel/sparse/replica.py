"""Replicas of the parameter servers' shards (ShardedEmbeddingCollection(..., replicate=True);
docs/sparse.md, "A server that dies").

Every server (a holder slot) has one buddy, another server, on another host where the servers'
hosts allow it (the ring in ring()). The buddy keeps in host memory a copy of the slot's rows
and row-optimizer state (its "replica"), kept current after every table step: when a step's
gradients have been applied, each server sends its buddy the rows that step changed (their new
values and optimizer state) in one alltoall over the job (the workers take part with nothing
to send, in their backward); the buddy writes them into its replica. So a step costs each
server the bytes of the rows it changed (about what the workers sent it as gradients) and every
rank one more alltoall; memory is one extra shard per server; nothing grows with the number of
servers squared.

Both copies of a slot (the server's own shard and the buddy's replica) keep an undo log of the
steps not yet known to be committed: the old values of the rows each step overwrote. At
rejoin() the job agrees on the number of committed table steps (rank 0's, after the elastic
state's sync), every surviving copy is rolled back to it, and a lost slot is rebuilt from its
buddy's replica: so the tables equal those of a job that never lost a server. A slot whose
server and buddy are both lost is an error naming both.

Wire format (int32 words, so fp32 and int64 share one alltoall): blocks of
[table, n, then n int64 global row ids, n x width fp32 rows, and per optimizer state entry in
name order: its scalar (0-d) as its own dtype's words, or the n rows of a per-row (1-D) or
per-element (2-D) entry]. The tables are row- or table-sharded (full rows), enforced at
construction.
Not thread-safe: the training thread (and the autograd thread in backward, never both at once).
"""

import torch

from hvdlite.common import exceptions
from hvdlite.torch.conjugate import exchange


class SlotCopy:
    """One holder slot's tables: `weights` (rows x dim per table), `states` (the RowOptimizer
    state dicts), `starts` (each table's first global row): the live shard on the slot's server,
    or a replica on its buddy. `steps`: table steps applied; `log`: [(step, undo records)]."""

    def __init__(self, weights, states, starts):
        self.weights, self.states, self.starts = weights, states, starts
        self.steps, self.log, self.current = 0, [], []

    def remember(self, t, rows):
        """Keeps the old values of table `t`'s local `rows` (unique; the caller never changes
        the tensor afterwards) and its scalars before a write."""
        w, st = self.weights[t], self.states[t]
        at = rows if rows.device == w.device else rows.to(w.device)
        saved = {k: (v.clone() if v.dim() == 0 else v.index_select(0, at)) for k, v in st.items()}
        self.current.append((t, rows, w.index_select(0, at), saved))

    def close_step(self):
        """Ends a step: its undo records join the log. Returns the local rows it wrote, per table."""
        touched: dict[int, list[torch.Tensor]] = {}
        for t, rows, _, _ in self.current:
            touched.setdefault(t, []).append(rows)
        self.steps += 1
        self.log.append((self.steps, self.current))
        self.current = []
        return {t: r[0] if len(r) == 1 else torch.unique(torch.cat(r)) for t, r in touched.items()}

    def confirm(self, committed):
        """Forgets the undo records of steps <= `committed` (they can no longer be rolled back)."""
        self.log = [entry for entry in self.log if entry[0] > committed]

    def reach(self):
        """(oldest step this copy can roll back to, its current step)."""
        return self.steps - len(self.log), self.steps

    def rollback(self, committed):
        """Undoes every step after `committed` (reach() must allow it)."""
        with torch.no_grad():
            while self.log and self.log[-1][0] > committed:
                _, records = self.log.pop()
                for t, rows, w_old, saved in reversed(records):
                    self.weights[t][rows.to(self.weights[t].device)] = w_old
                    for k, old in saved.items():
                        v = self.states[t][k]
                        if v.dim() == 0:
                            v.copy_(old)
                        else:
                            v[rows.to(v.device)] = old
        self.steps, self.current = committed, []


def encode(copy, t, global_rows):
    """One block (int32 words) of table `t`'s `global_rows` of `copy`, with its scalars."""
    local = global_rows - copy.starts[t]
    parts = [torch.tensor([t, global_rows.numel()], dtype=torch.int64).view(torch.int32)]
    parts.append(global_rows.to(torch.int64).contiguous().view(torch.int32))
    parts.append(
        copy.weights[t].index_select(0, local.to(copy.weights[t].device)).cpu().reshape(-1).view(torch.int32)
    )
    for k in sorted(copy.states[t]):
        v = copy.states[t][k]
        picked = v.reshape(1) if v.dim() == 0 else v.index_select(0, local.to(v.device)).reshape(-1)
        parts.append(picked.cpu().contiguous().view(torch.int32))
    return torch.cat(parts)


def decode_into(copy, words, record):
    """Writes every block of `words` into `copy` (remembering the old rows first when
    `record`). Returns the tables written."""
    written, at = set(), 0
    with torch.no_grad():
        while at < words.numel():
            t, n = (int(x) for x in words[at : at + 4].view(torch.int64))
            at += 4
            rows = words[at : at + 2 * n].view(torch.int64) - copy.starts[t]
            at += 2 * n
            w = copy.weights[t]
            width = w.shape[1] if w.dim() == 2 else 0
            if record:
                copy.remember(t, rows)
            values = words[at : at + n * width].view(torch.float32).view(n, width)
            at += n * width
            if n:
                w[rows.to(w.device)] = values.to(w.device)
            for k in sorted(copy.states[t]):
                v = copy.states[t][k]
                size = v.element_size() // 4 if v.dim() == 0 else n * (v.shape[1] if v.dim() == 2 else 1)
                chunk = words[at : at + size]
                at += size
                if v.dim() == 0:
                    v.copy_(chunk.view(v.dtype).reshape(()))
                elif n:
                    v[rows.to(v.device)] = chunk.view(torch.float32).view(n, *v.shape[1:]).to(v.device)
            written.add(t)
    return written


def send_blocks(blocks, ps, name):
    """One alltoall over `ps`: `blocks[m]` (a list of int32 word tensors) to member m. Returns
    the words received from each member."""
    flat = [torch.cat(b) if b else torch.zeros(0, dtype=torch.int32) for b in blocks]
    got, counts = exchange(torch.cat(flat), [f.numel() for f in flat], name, ps)
    return torch.split(got, counts)


def ring(hosts):
    """{slot: its buddy slot} for slots whose servers sit on `hosts` (one host id per slot):
    slots ordered by host, each backed by the slot as many places further round the ring as
    the largest host holds servers, so a buddy is on another host whenever no host holds more
    than half the servers. One buddy per slot and one ward per buddy."""
    n = len(hosts)
    order = sorted(range(n), key=lambda s: (hosts[s], s))
    groups: dict[int, int] = {}
    for h in hosts:
        groups[h] = groups.get(h, 0) + 1
    shift = max(groups.values())
    shift = 1 if shift >= n else shift
    return {order[i]: order[(i + shift) % n] for i in range(n)}


class Replicas:
    """A collection's replication (every rank has one; only servers hold copies). Set up by
    rejoin() (recover.py): until the first rejoin() nothing is replicated. `ring`: {slot: buddy
    slot}; `slot`: this server's slot (None: a worker); `own`: the live shard as a SlotCopy;
    `replica`: the copy of slot `ward` (the slot whose buddy this server is)."""

    def __init__(self):
        self.ring = None
        self.slot = self.ward = self.buddy_pos = self.ward_pos = None
        self.own = self.replica = None

    def record(self, updates):
        """Before a step's updates are applied to the live shard: their rows' old values."""
        if self.own is not None:
            for t, rows, _ in updates:
                self.own.remember(t, rows)

    def push(self, ex):
        """After a step was applied (every rank, in the same place of its step): the rows it
        changed go to the buddy, and the ward's land in the replica. One alltoall over the
        exchange `ex`'s set; the bytes sent count in its traffic (replica_bytes)."""
        ps = ex.ps
        touched = self.own.close_step() if self.own is not None else {}
        if not self.ring:  # not set up yet, or no buddy (one server): the undo log only
            return
        blocks: list[list[torch.Tensor]] = [[] for _ in ps.ranks]
        if self.own is not None and self.buddy_pos is not None:
            empty = torch.zeros(0, dtype=torch.int64)
            for t in range(len(self.own.weights)):
                rows = touched.get(t, empty) + self.own.starts[t]
                blocks[self.buddy_pos].append(encode(self.own, t, rows))
        ex.traffic.replica_bytes += sum(int(b.numel()) * 4 for part in blocks for b in part)
        got = send_blocks(blocks, ps, ex.name + ".replica")
        if self.replica is not None:
            decode_into(self.replica, got[self.ward_pos], record=True)
            self.replica.close_step()

    def confirm(self, keep_last=False):
        """The job committed this server's last step (keep_last: keep one step's undo records,
        when the server learns of no commits)."""
        for copy in (self.own, self.replica):
            if copy is not None:
                copy.confirm(copy.steps - 1 if keep_last else copy.steps)


def check_replicable(holders, layouts, staleness):
    """replicate=True needs two servers or more, full rows (no column sharding) and staleness 0
    (the gradients a staleness bound holds back are not replicated)."""
    if holders is None or len(holders) < 2:
        raise exceptions.InvalidArgumentError(
            "replicate=True copies each server's shard to another server: give servers=[...] at least two ranks"
        )
    column = sorted(n for n, lay in layouts.items() if lay.sharding == "column")
    if column or staleness:
        raise exceptions.NotSupportedError(
            "replicate=True supports row- and table-sharded tables at staleness 0; got %s"
            % ("column sharding of %s" % column if column else "staleness=%d" % staleness)
        )


def run_on_step(replicas, on_step):
    """A server's end of a step: runs `on_step` (its part of the workers' commit). When that
    returns, or raises HostsUpdatedInterrupt (raised after the state was saved), rank 0 has
    committed the step, so `replicas` (None: none kept) forget how to undo it; without
    `on_step` they keep one step's undo records."""
    if on_step is None:
        if replicas is not None:
            replicas.confirm(keep_last=True)
        return
    try:
        on_step()
    except exceptions.HostsUpdatedInterrupt:
        if replicas is not None:
            replicas.confirm()
        raise
    if replicas is not None:
        replicas.confirm()
