"""Pipeline schedules as data: every rank's ordered list of actions, generated and checked
before anything runs. Framework-neutral (no tensors here).

Stages and ranks: stage s runs on pipeline rank ``s % num_ranks`` (pipeline ranks are the
positions 0..p-1 inside one pp group), so with v stages per rank rank r holds stages
r, r+p, ..., r+(v-1)p (the "loop" placement of interleaved schedules).

Actions (``Action(kind, stage, mb, peer)``, peer a pipeline rank for transfers):
  F       forward of `stage` on microbatch `mb`
  B       full backward (input and weight gradients)
  I, W    split backward (zero-bubble): input gradient, then later weight gradient
  SEND_F  send stage's output activation to the next stage's rank (peer)
  RECV_F  receive stage's input activation from the previous stage's rank (peer)
  SEND_B  send the gradient of stage's input to the previous stage's rank
  RECV_B  receive the gradient of stage's output from the next stage's rank

Transfers are blocking and matched: a SEND completes only together with the peer's RECV
(that is how collectives on a two-rank set behave). When both directions of one pair fall on
the same instant, the first of the two is marked ``fused`` on both ranks and the pair runs as
one exchange (one collective instead of two). Generation therefore works in two steps:
a per-rank order of compute actions (the schedule's policy), then one global order of events
from a timed simulation, projected onto every rank. Because every rank executes its events in
the order of one global sequence, the earliest unfinished event always has all its
participants waiting on it: no deadlock is possible, and both ranks of a pair see their
transfers in the same order. ``check`` verifies all of that again on the lists alone.
"""

import collections

from hvdlite.common import exceptions

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble")
COMPUTE = ("F", "B", "I", "W")
TRANSFERS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
COSTS = {"F": 1, "B": 2, "I": 1, "W": 1}  # relative durations used to order events


class ScheduleError(exceptions.InvalidArgumentError):
    """A schedule that cannot run: an impossible configuration, or action lists that would
    deadlock, mismatch their transfers or miss a microbatch."""


class Action(collections.namedtuple("Action", "kind stage mb peer fused")):
    """``fused`` (transfers only): this transfer and the next action of the same rank, the
    transfer in the other direction with the same peer, run as one exchange (both ranks of
    the pair flag the same one)."""

    __slots__ = ()

    def __new__(cls, kind, stage, mb, peer=None, fused=False):
        return super().__new__(cls, kind, stage, mb, peer, fused)

    def __str__(self):
        text = "%s(s%d,mb%d" % (self.kind, self.stage, self.mb)
        return text + (",peer%d)" % self.peer if self.peer is not None else ")") + ("+" if self.fused else "")


class PipelineSchedule:
    """Generated, checked action lists: ``actions[r]`` is pipeline rank r's list."""

    def __init__(self, name, num_ranks, num_stages, n_microbatches, actions, split_backward, timeline):
        self.name = name
        self.num_ranks = num_ranks
        self.num_stages = num_stages
        self.n_microbatches = n_microbatches
        self.actions = actions
        self.split_backward = split_backward
        self.timeline = timeline  # [(rank, start, end, Action)] of the generating simulation

    def stage_rank(self, stage):
        return stage % self.num_ranks

    def simulated_idle_fraction(self):
        """Per rank: the share of the simulated makespan (F=1, B=2, I=W=1) spent idle."""
        span = max(end for _, _, end, _ in self.timeline)
        busy = [0] * self.num_ranks
        for r, start, end, _ in self.timeline:
            busy[r] += end - start
        return [1.0 - b / span for b in busy]

    def describe(self):
        lines = [
            "%s: %d ranks, %d stages, %d microbatches"
            % (self.name, self.num_ranks, self.num_stages, self.n_microbatches)
        ]
        for r, acts in enumerate(self.actions):
            lines.append("  rank %d: %s" % (r, " ".join(str(a) for a in acts if a.kind in COMPUTE)))
        return "\n".join(lines)


# ---- compute orders (the schedules' policies) ------------------------------------------


def _one_stage_orders(name, p, m):
    orders = []
    for r in range(p):
        if name == "GPipe":
            orders.append([("F", r, k) for k in range(m)] + [("B", r, k) for k in range(m)])
            continue
        warmup = min(p - 1 - r, m)
        order = [("F", r, k) for k in range(warmup)]
        for k in range(warmup, m):
            order += [("F", r, k), ("B", r, k - warmup)]
        order += [("B", r, k) for k in range(m - warmup, m)]
        orders.append(order)
    return orders


def _interleaved_orders(p, v, m):
    """torch.distributed.pipelining's interleaved 1F1B: microbatches in rounds of
    m // rounds (rounds = max(1, m // p)); each round goes through every local stage
    forward, and through them in reverse backward."""
    rounds = max(1, m // p)
    if m % rounds:
        raise ScheduleError(
            "interleaved schedules on %d ranks need n_microbatches divisible by max(1, n_microbatches // %d) "
            "(= %d); %d is not: use a multiple of %d or fewer than %d microbatches"
            % (p, p, rounds, m, p, 2 * p)
        )
    per_round = m // rounds
    total = m * v

    def order(r, backward):
        out = []
        for k in range(total):
            rnd, within = divmod(k, per_round * v)
            chunk, pos = divmod(within, per_round)
            if backward:
                chunk = v - 1 - chunk
            out.append((chunk * p + r, rnd * per_round + pos))
        return out

    orders = []
    for r in range(p):
        fwd, bwd = order(r, False), order(r, True)
        warmup = min(total, (v - 1) * per_round + 2 * (p - 1 - r))
        seq = [("F",) + fwd[k] for k in range(warmup)]
        b = 0
        for k in range(warmup, total):
            seq += [("F",) + fwd[k], ("B",) + bwd[b]]
            b += 1
        seq += [("B",) + bwd[k] for k in range(b, total)]
        orders.append(seq)
    return orders


def compute_orders(name, num_ranks, stages_per_rank, n_microbatches):
    """Each pipeline rank's compute actions in policy order, as (kind, stage, mb) tuples
    (zero-bubble lists hold I in place of B; their W actions are placed by the simulation)."""
    p, v, m = num_ranks, stages_per_rank, n_microbatches
    if name not in SCHEDULES:
        raise ScheduleError("unknown schedule %r; one of %s" % (name, ", ".join(SCHEDULES)))
    if p < 1 or v < 1 or m < 1:
        raise ScheduleError(
            "%s needs at least one rank, stage per rank and microbatch; got %d ranks, %d stages per rank, "
            "%d microbatches" % (name, p, v, m)
        )
    if name in ("GPipe", "1F1B") and v != 1:
        raise ScheduleError("%s runs one stage per rank; got %d (use ScheduleInterleaved1F1B)" % (name, v))
    if name in ("GPipe", "1F1B"):
        return _one_stage_orders(name, p, m)
    orders = _interleaved_orders(p, v, m)
    if name == "InterleavedZeroBubble":
        orders = [[("I",) + a[1:] if a[0] == "B" else a for a in order] for order in orders]
    return orders


# ---- global event order from a timed simulation ------------------------------------------


class _Sim:
    """Discrete-time run of the compute orders: a rank starts its next compute action as soon
    as its inputs are there. Zero-bubble W actions are deferred: one runs when the next
    action's inputs are not there yet, or when more than p-1-r are pending on rank r (ZB-H1's
    rule: early ranks have the most bubble to fill at the end; it also bounds the activations
    kept alive);
    outputs travel to the next rank when the action ends. Produces one global event list."""

    def __init__(self, orders, p, num_stages, split):
        self.orders, self.p, self.n, self.split = orders, p, num_stages, split
        self.act = set()  # (stage, mb) whose input activation is on the stage's rank
        self.grad = set()  # (stage, mb) whose output gradient is on the stage's rank
        self.done = set()  # (kind, stage, mb) finished
        self.events = []  # (rank, Action) in global order
        self.timeline = []

    def _ready(self, kind, s, mb):
        if kind == "F":
            return s == 0 or (s, mb) in self.act
        if kind == "W":
            return True
        return ("F", s, mb) in self.done and (s == self.n - 1 or (s, mb) in self.grad)

    def run(self):
        p = self.p
        ptr = [0] * p
        wq: list[list[tuple[str, int, int]]] = [[] for _ in range(p)]
        busy_until = [0] * p
        running: list[tuple[str, int, int] | None] = [None] * p
        total = sum(len(o) for o in self.orders) + sum(a[0] == "I" for o in self.orders for a in o)
        t = 0
        while len(self.done) < total:
            transfers = []
            for r in range(p):  # actions ending now
                if running[r] is not None and busy_until[r] == t:
                    transfers += self._finish(r, running[r], wq)
                    running[r] = None
            ordered, second = sorted(transfers, key=_transfer_key), False
            for i, x in enumerate(ordered):
                # both directions of one pair in the same instant: one exchange
                nxt = ordered[i + 1] if i + 1 < len(ordered) else None
                fuse = not second and nxt is not None and _pair(nxt) == _pair(x) and nxt[3] != x[3] != x[4]
                kind, s, mb, src, dst = x
                self._transfer(kind, s, mb, src, dst, fused=fuse)
                second = fuse
            started = False
            for r in range(p):
                if running[r] is not None:
                    continue
                nxt = self._pick(r, ptr, wq[r])
                if nxt is None:
                    continue
                running[r], busy_until[r], started = nxt, t + COSTS[nxt[0]], True
                self.events.append((r, Action(*nxt)))
                self.timeline.append((r, t, busy_until[r], Action(*nxt)))
            stuck = not started and not transfers and all(x is None for x in running)
            if stuck and len(self.done) < total:
                heads = [
                    "rank %d waits at %s" % (r, Action(*self.orders[r][ptr[r]]))
                    for r in range(p)
                    if ptr[r] < len(self.orders[r])
                ]
                raise ScheduleError("schedule cannot make progress: " + "; ".join(heads))
            t += 1
        return self.events, self.timeline

    def _pick(self, r, ptr, deferred):
        """Rank r's next compute action if it can start now (advancing ptr), else None."""
        nxt = self.orders[r][ptr[r]] if ptr[r] < len(self.orders[r]) else None
        ready = nxt is not None and self._ready(*nxt)
        if deferred and (not ready or len(deferred) > self.p - 1 - r):
            return deferred.pop(0)  # a deferred W: fills a wait, or keeps at most p-1-r pending
        if ready:
            ptr[r] += 1
            return nxt
        return None

    def _finish(self, r, action, wq):
        kind, s, mb = action
        self.done.add(action)
        if kind == "I":
            wq[r].append(("W", s, mb))
        out = []
        if kind == "F" and s < self.n - 1:
            out.append(("F", s, mb, r, (s + 1) % self.p))
        if kind in ("B", "I") and s > 0:
            out.append(("B", s, mb, r, (s - 1) % self.p))
        return out

    def _transfer(self, kind, s, mb, src, dst, fused=False):
        if kind == "F":
            self.act.add((s + 1, mb))
            if src != dst:
                self.events.append((src, Action("SEND_F", s, mb, dst, fused)))
                self.events.append((dst, Action("RECV_F", s + 1, mb, src, fused)))
        else:
            self.grad.add((s - 1, mb))
            if src != dst:
                self.events.append((src, Action("SEND_B", s, mb, dst, fused)))
                self.events.append((dst, Action("RECV_B", s - 1, mb, src, fused)))


def _pair(x):
    return (min(x[3], x[4]), max(x[3], x[4]))


def _transfer_key(x):
    kind, s, mb, src, dst = x
    return (min(src, dst), max(src, dst), kind, s, mb)


def build(name, num_ranks, stages_per_rank=1, n_microbatches=1):
    """The checked PipelineSchedule `name` (one of SCHEDULES) for `num_ranks` pipeline ranks
    with `stages_per_rank` stages each. Raises ScheduleError for impossible configurations."""
    orders = compute_orders(name, num_ranks, stages_per_rank, n_microbatches)
    num_stages = num_ranks * stages_per_rank
    split = name == "InterleavedZeroBubble"
    events, timeline = _Sim(orders, num_ranks, num_stages, split).run()
    actions: list[list[Action]] = [[] for _ in range(num_ranks)]
    for r, a in events:
        actions[r].append(a)
    schedule = PipelineSchedule(name, num_ranks, num_stages, n_microbatches, actions, split, timeline)
    check(schedule)
    return schedule


# ---- the checker -------------------------------------------------------------------------


def _transfer_id(rank, a, p):
    """(sender, receiver, direction, sending stage, mb) of a transfer action on `rank`."""
    if a.kind == "SEND_F":
        return (rank, a.peer, "F", a.stage, a.mb)
    if a.kind == "RECV_F":
        return (a.peer, rank, "F", a.stage - 1, a.mb)
    if a.kind == "SEND_B":
        return (rank, a.peer, "B", a.stage, a.mb)
    return (a.peer, rank, "B", a.stage + 1, a.mb)


def _check_coverage(sched, seen, want):
    n, m = sched.num_stages, sched.n_microbatches
    for kind in ("F",) + want:
        for s in range(n):
            for mb in range(m):
                if seen[(kind, s, mb)] != 1:
                    raise ScheduleError(
                        "%s runs %s of stage %d microbatch %d %d times; every one must run exactly once"
                        % (sched.name, kind, s, mb, seen[(kind, s, mb)])
                    )


def _check_fused(r, acts):
    """A fused transfer is followed by the opposite transfer with the same peer, unfused."""
    for i, a in enumerate(acts):
        if a.kind in TRANSFERS and a.fused:
            b = acts[i + 1] if i + 1 < len(acts) else None
            if (
                b is None
                or b.kind not in TRANSFERS
                or b.peer != a.peer
                or b.fused
                or b.kind.startswith("SEND") == a.kind.startswith("SEND")
            ):
                raise ScheduleError(
                    "rank %d: fused %s must be followed by the opposite transfer with the same peer, not %s"
                    % (r, a, b)
                )


def _check_static(sched):
    p, n, m = sched.num_ranks, sched.num_stages, sched.n_microbatches
    want = ("I", "W") if sched.split_backward else ("B",)
    seen: collections.Counter[tuple[str, int, int]] = collections.Counter()
    links: dict[tuple[int, int], dict[int, list[tuple[tuple[int, int, str, int, int], bool]]]] = (
        collections.defaultdict(lambda: collections.defaultdict(list))
    )
    for r, acts in enumerate(sched.actions):
        for a in acts:
            if not (0 <= a.stage < n and 0 <= a.mb < m) or sched.stage_rank(a.stage) != r:
                raise ScheduleError("rank %d: %s names a stage or microbatch it does not hold" % (r, a))
            if a.kind in COMPUTE:
                if a.kind not in ("F",) + want:
                    raise ScheduleError("rank %d: %s is not an action of %s" % (r, a, sched.name))
                seen[(a.kind, a.stage, a.mb)] += 1
                continue
            if a.kind not in TRANSFERS:
                raise ScheduleError("rank %d: unknown action %s" % (r, a))
            tid = _transfer_id(r, a, p)
            nxt = a.stage + 1 if a.kind == "SEND_F" else a.stage - 1 if a.kind == "SEND_B" else a.stage
            if a.kind.startswith("SEND") and (not 0 <= nxt < n or sched.stage_rank(nxt) != a.peer):
                raise ScheduleError("rank %d: %s sends to a rank that does not hold the peer stage" % (r, a))
            links[(min(r, a.peer), max(r, a.peer))][r].append((tid, a.fused))
        _check_fused(r, acts)
    for (a, b), per_rank in links.items():
        sa, sb = per_rank.get(a, []), per_rank.get(b, [])
        if sa != sb:
            k = next((i for i, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
            raise ScheduleError(
                "ranks %d and %d issue their transfers in different orders (blocking send/recv would "
                "deadlock): at transfer #%d rank %d has %s, rank %d has %s"
                % (a, b, k, a, sa[k] if k < len(sa) else "nothing", b, sb[k] if k < len(sb) else "nothing")
            )
    return seen, want


def _deps_met(sched, r, a, local):
    """Whether rank r, having done `local` (a set of (kind, stage, mb)), may run compute a."""
    last = sched.num_stages - 1
    if a.kind == "F":
        return a.stage == 0 or ("RECV_F", a.stage, a.mb) in local or ("F", a.stage - 1, a.mb) in local
    if a.kind == "W":
        return ("I", a.stage, a.mb) in local
    got_grad = a.stage == last or ("RECV_B", a.stage, a.mb) in local
    got_grad = got_grad or any((k, a.stage + 1, a.mb) in local for k in ("B", "I"))
    return ("F", a.stage, a.mb) in local and got_grad


def _precheck(sched, r, a, local):
    """Raises unless rank r, having done `local`, has what action a consumes."""
    if a.kind in COMPUTE and not _deps_met(sched, r, a, local):
        raise ScheduleError("rank %d runs %s before its input is there" % (r, a))
    if a.kind == "SEND_F" and ("F", a.stage, a.mb) not in local:
        raise ScheduleError("rank %d runs %s before the forward that produces it" % (r, a))
    if a.kind == "SEND_B" and not any((k, a.stage, a.mb) in local for k in ("B", "I")):
        raise ScheduleError("rank %d runs %s before the backward that produces it" % (r, a))


def _unit(sched, r, i):
    """The actions rank r runs as one step from index i: one action, or a fused exchange."""
    acts = sched.actions[r]
    return acts[i : i + 2] if acts[i].kind in TRANSFERS and acts[i].fused else acts[i : i + 1]


def _matches(sched, r, unit, q, other):
    p = sched.num_ranks
    return len(unit) == len(other) and all(
        y.kind in TRANSFERS and y.peer == r and _transfer_id(q, y, p) == _transfer_id(r, x, p)
        for x, y in zip(unit, other)
    )


def check(sched):
    """Raises ScheduleError unless the action lists run to the end under blocking, matched
    send/recv: every (stage, microbatch) forward and backward (or I and W) exactly once on the
    stage's rank, inputs received or produced before use, both ranks of every pair issuing
    their transfers (and fused exchanges) in the same order, and no circular wait."""
    seen, want = _check_static(sched)
    p = sched.num_ranks
    ptr = [0] * p
    local: list[set[tuple[str, int, int]]] = [set() for _ in range(p)]
    while any(ptr[r] < len(sched.actions[r]) for r in range(p)):
        progress = False
        for r in range(p):
            while ptr[r] < len(sched.actions[r]):
                unit = _unit(sched, r, ptr[r])
                sides = [(r, unit)]
                if unit[0].kind in TRANSFERS:
                    q = unit[0].peer
                    other = _unit(sched, q, ptr[q]) if ptr[q] < len(sched.actions[q]) else []
                    if not _matches(sched, r, unit, q, other):
                        break  # waits for the peer
                    sides.append((q, other))
                for rank, acts in sides:  # everything an exchange sends exists before it starts
                    for x in acts:
                        _precheck(sched, rank, x, local[rank])
                for rank, acts in sides:
                    local[rank].update((x.kind, x.stage, x.mb) for x in acts)
                    ptr[rank] += len(acts)
                progress = True
        if not progress:
            heads = [
                "rank %d at %s" % (r, sched.actions[r][ptr[r]])
                for r in range(p)
                if ptr[r] < len(sched.actions[r])
            ]
            raise ScheduleError("%s deadlocks under blocking send/recv: %s" % (sched.name, "; ".join(heads)))
    _check_coverage(sched, seen, want)
    return True
