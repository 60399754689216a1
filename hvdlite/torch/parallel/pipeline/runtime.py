"""Pipeline parallelism with torch.distributed.pipelining's names: ``PipelineStage`` and the
schedules ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B`` and
``ScheduleInterleavedZeroBubble`` (backward split into input gradient and weight gradient;
with one stage per rank it is ZB-H1-like).

Every schedule is first generated as per-rank action lists (hvdlite.parallel.schedules) and
checked there (no deadlock under blocking send/recv, every microbatch forward and backward
exactly once, both ranks of a pair transferring in the same order); then each rank executes
its own list. Impossible configurations raise ScheduleError at construction.

``step(*args, target=None, losses=None, **kwargs)``: args go to the first stage and are split
into microbatches along dim 0, target (split the same way) and losses to the last, kwargs to
every stage (tensors split along dim 0, anything else passed as is). A stage's output (a
tensor or a tuple of tensors) becomes the next stage's positional arguments. Each
microbatch's loss is scaled by its share of the batch's rows (1/n_microbatches for an even
split), so for a loss that averages over the batch, the accumulated gradients equal one
process's on the whole batch. The unscaled losses are appended to `losses`. Every rank of the
pipeline calls step(); gradients accumulate in .grad (the caller zeroes them and, with data
parallelism, reduces them over the dp set).
"""

import time
from typing import Any

import torch

from hvdlite.common import exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.parallel import schedules
from hvdlite.torch.parallel.pipeline import transfer as p2p

# Receives are posted this many actions ahead of the action that needs them: far enough that
# a transfer's header (and then its tensors) arrive while this rank computes, near enough
# that a posted receive never waits long (the core times out a receive
# HVDLITE_TIMEOUT_SECONDS after its post).
_RECV_LOOKAHEAD = 8


class PipelineStage:
    """Stage `stage_index` of `num_stages` running `module`, on pipeline member
    ``stage_index % process_set.size()`` of `process_set` (the pp group, e.g.
    mesh.process_set("pp"))."""

    def __init__(self, module, stage_index, num_stages, process_set=global_process_set, device=None):
        p, me = process_set.size(), process_set.rank()
        if me < 0:
            raise exceptions.InvalidArgumentError("PipelineStage: this rank is not in %r" % (process_set,))
        if not 0 <= stage_index < num_stages or num_stages % p:
            raise exceptions.InvalidArgumentError(
                "PipelineStage: stage %d of %d on %d pipeline ranks: stages must number a multiple of the "
                "ranks, each index in [0, num_stages)" % (stage_index, num_stages, p)
            )
        if stage_index % p != me:
            raise exceptions.InvalidArgumentError(
                "PipelineStage: stage %d belongs on pipeline rank %d (stage %% %d), but this is pipeline rank %d"
                % (stage_index, stage_index % p, p, me)
            )
        self.submod = module
        self.stage_index, self.num_stages = stage_index, num_stages
        self.process_set, self.device = process_set, device
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1

    def rank_of(self, stage):
        """The global rank that runs `stage`."""
        ranks = self.process_set.ranks
        return ranks[stage % len(ranks)]


def _split(value, m, what):
    if not isinstance(value, torch.Tensor):
        return [value] * m
    if value.dim() == 0 or value.shape[0] < m:
        raise exceptions.InvalidArgumentError(
            "%s with %s rows cannot be split into %d microbatches"
            % (what, value.shape[0] if value.dim() else "no", m)
        )
    return list(torch.tensor_split(value, m, dim=0))


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _zeros_for_none(grads, like):
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, like)]


class _PipelineScheduleBase:
    _kind = ""

    def __init__(self, stages, n_microbatches, loss_fn=None):
        stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
        if not stages:
            raise exceptions.InvalidArgumentError("%s needs at least one stage" % type(self).__name__)
        ps, n = stages[0].process_set, stages[0].num_stages
        if any(s.process_set is not ps or s.num_stages != n for s in stages):
            raise exceptions.InvalidArgumentError(
                "all stages of one schedule share process_set and num_stages"
            )
        p = ps.size()
        if n != p * len(stages):
            raise exceptions.InvalidArgumentError(
                "%s: %d stages on %d pipeline ranks need %d stages per rank; this rank passed %d"
                % (type(self).__name__, n, p, n // p, len(stages))
            )
        if loss_fn is None:
            raise exceptions.InvalidArgumentError("%s needs loss_fn to run backward" % type(self).__name__)
        self._stages = {s.stage_index: s for s in stages}
        self._n_microbatches, self._loss_fn = n_microbatches, loss_fn
        self.schedule = schedules.build(self._kind, p, len(stages), n_microbatches)
        self._actions = self.schedule.actions[ps.rank()]
        self._ps = ps
        self._recv_at = [i for i, a in enumerate(self._actions) if a.kind.startswith("RECV")]
        self.last_timeline: list[tuple[schedules.Action, float, float]] = []

    # ---- one step --------------------------------------------------------------------

    def step(self, *args, target=None, losses=None, **kwargs):
        """Runs one training step's forward and backward passes over every microbatch.
        Returns the last stage's outputs concatenated along dim 0 on the rank that holds it,
        None elsewhere."""
        self._prepare(args, target, kwargs)
        self._outgoing: list[p2p.Outgoing] = []  # posted sends: the core moves them while this rank computes
        self._incoming: dict[int, p2p.Incoming] = {}  # posted receives by transfer tag
        self._n_posted = 0  # receive actions (of self._recv_at) posted so far
        timeline = []
        i = 0
        while i < len(self._actions):
            if self._actions[i].kind in schedules.COMPUTE:
                self._post_receives_before(i + _RECV_LOOKAHEAD)
            action, start = self._actions[i], time.perf_counter()
            if action.fused:  # this transfer and the next one, in the other direction, as one exchange
                self._exchange(action, self._actions[i + 1])
                timeline.append((action, start, time.perf_counter()))
                action, i = self._actions[i + 1], i + 1
            else:
                getattr(self, "_do_" + action.kind)(action)
            timeline.append((action, start, time.perf_counter()))
            i += 1
        for out in self._outgoing:  # returns once the core has every buffer (not the receivers)
            out.wait()
        self._outgoing = []
        self.last_timeline = timeline
        if losses is not None:
            losses.extend(self._losses[k] for k in sorted(self._losses))
        if not self._results:
            return None
        return torch.cat([self._results[k] for k in sorted(self._results)])

    def _prepare(self, args, target, kwargs):
        """Splits the step's arguments into microbatches and resets the per-step state."""
        m = self._n_microbatches
        self._args = list(zip(*[_split(a, m, "argument") for a in args])) if args else [()] * m
        split_kw = {k: _split(v, m, "keyword %r" % k) for k, v in kwargs.items()}
        self._kwargs = [{k: v[i] for k, v in split_kw.items()} for i in range(m)]
        self._targets: list[Any] = [None] * m
        self._weights = [1.0 / m] * m
        if isinstance(target, torch.Tensor):
            self._targets = _split(target, m, "target")
            self._weights = [t.shape[0] / target.shape[0] for t in self._targets]
        elif target is not None:
            self._targets = [target] * m
        if 0 in self._stages and not args:
            raise exceptions.InvalidArgumentError("step(): the first stage's rank must pass the inputs")
        if self.schedule.num_stages - 1 in self._stages and target is None:
            raise exceptions.InvalidArgumentError("step(): the last stage's rank must pass target=")
        self._inputs: dict[tuple[int, int], Any] = {}
        self._outputs: dict[tuple[int, int], Any] = {}
        self._roots: dict[tuple[int, int], Any] = {}
        self._grad_out: dict[tuple[int, int], Any] = {}
        self._grad_in: dict[tuple[int, int], Any] = {}
        self._results: dict[int, torch.Tensor] = {}
        self._losses: dict[int, torch.Tensor] = {}

    def _tag(self, sender_stage, mb, direction):
        """The transfer id both ends give the transfer of microbatch mb from sender_stage
        in `direction` ("F" or "B"): unique within a step, so matching never depends on order."""
        return (sender_stage * self._n_microbatches + mb) * 2 + (direction == "B")

    def _transfer_tag(self, a):
        """The transfer id of transfer action a (named by the sending stage)."""
        sender = {"SEND_F": a.stage, "SEND_B": a.stage, "RECV_F": a.stage - 1, "RECV_B": a.stage + 1}[a.kind]
        return self._tag(sender, a.mb, a.kind[-1])

    def _post_send(self, a, payload, to_stage):
        peer = self._ps.ranks.index(self._stages[a.stage].rank_of(to_stage))
        self._outgoing.append(p2p.send(list(payload), peer, self._transfer_tag(a), self._ps))

    def _post_receives_before(self, end):
        """Posts the receives of the receive actions before action index `end` (their headers
        land while this rank computes), and the tensors' receives of posted transfers whose
        header is here; never blocks."""
        for inc in self._incoming.values():
            inc.poll()
        while self._n_posted < len(self._recv_at) and self._recv_at[self._n_posted] < end:
            self._post_next_receive()

    def _post_next_receive(self):
        """Posts the receive of the next receive action not posted yet (they are posted in order)."""
        a = self._actions[self._recv_at[self._n_posted]]
        self._n_posted += 1
        stage = self._stages[a.stage]
        peer = self._ps.ranks.index(stage.rank_of(a.stage + (1 if a.kind == "RECV_B" else -1)))
        self._incoming[self._transfer_tag(a)] = p2p.Incoming(
            peer, self._transfer_tag(a), self._ps, stage.device
        )

    def _receive(self, a):
        """The tensors of receive action a (posted now, with the ones before it, if not yet)."""
        tag = self._transfer_tag(a)
        while tag not in self._incoming:
            self._post_next_receive()
        return self._incoming.pop(tag).wait()

    def _exchange(self, a, b):
        """Transfers a and b (one SEND, one RECV, same peer): the send is posted first, so
        the two ranks' transfers cross without waiting for each other."""
        send, recv = (a, b) if a.kind.startswith("SEND") else (b, a)
        getattr(self, "_do_" + send.kind)(send)
        getattr(self, "_do_" + recv.kind)(recv)

    def _do_F(self, a):
        stage = self._stages[a.stage]
        inputs = self._args[a.mb] if stage.is_first else self._inputs[(a.stage, a.mb)]
        out = stage.submod(*inputs, **self._kwargs[a.mb])
        if stage.is_last:
            loss = self._loss_fn(out, self._targets[a.mb])
            self._losses[a.mb] = loss.detach()
            self._results[a.mb] = _as_tuple(out)[0].detach()
            self._roots[(a.stage, a.mb)] = ([loss * self._weights[a.mb]], None)
            return
        outs = _as_tuple(out)
        self._outputs[(a.stage, a.mb)] = outs
        if a.stage + 1 in self._stages:  # the next stage is on this rank (one pipeline rank)
            self._inputs[(a.stage + 1, a.mb)] = tuple(_handoff(t) for t in outs)

    def _do_SEND_F(self, a):
        self._post_send(a, self._outputs[(a.stage, a.mb)], a.stage + 1)

    def _do_RECV_F(self, a):
        self._inputs[(a.stage, a.mb)] = tuple(self._receive(a))

    def _roots_of(self, a):
        """(tensors to differentiate, their upstream gradients) of stage a.stage, microbatch a.mb."""
        if (a.stage, a.mb) in self._roots:
            return self._roots[(a.stage, a.mb)]
        outs = [t for t in self._outputs.pop((a.stage, a.mb)) if t.requires_grad]
        grads = self._grad_out.pop((a.stage, a.mb))
        if len(grads) != len(outs):
            raise exceptions.MismatchError(
                "stage %d microbatch %d: %d outputs need gradients but %d arrived"
                % (a.stage, a.mb, len(outs), len(grads))
            )
        self._roots[(a.stage, a.mb)] = (outs, grads)
        return outs, grads

    def _grad_targets(self, a):
        inputs = () if self._stages[a.stage].is_first else self._inputs.get((a.stage, a.mb), ())
        return [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]

    def _store_input_grads(self, a, grads):
        self._grad_in[(a.stage, a.mb)] = grads
        if a.stage - 1 in self._stages:
            self._grad_out[(a.stage - 1, a.mb)] = grads

    def _do_B(self, a):
        outs, grads = self._roots_of(a)
        del self._roots[(a.stage, a.mb)]
        targets = self._grad_targets(a)
        if outs:
            torch.autograd.backward(outs, grads)
        self._store_input_grads(a, _zeros_for_none([t.grad for t in targets], targets))
        self._inputs.pop((a.stage, a.mb), None)

    def _do_I(self, a):
        outs, grads = self._roots_of(a)
        targets = self._grad_targets(a)
        got = []
        if outs and targets:
            got = torch.autograd.grad(outs, targets, grads, retain_graph=True, allow_unused=True)
        self._store_input_grads(a, _zeros_for_none(list(got), targets) if targets else [])

    def _do_W(self, a):
        outs, grads = self._roots.pop((a.stage, a.mb))
        params = [p for p in self._stages[a.stage].submod.parameters() if p.requires_grad]
        if outs and params:
            torch.autograd.backward(outs, grads, inputs=params)
        self._inputs.pop((a.stage, a.mb), None)

    def _do_SEND_B(self, a):
        self._post_send(a, self._grad_in.pop((a.stage, a.mb)), a.stage - 1)

    def _do_RECV_B(self, a):
        self._grad_out[(a.stage, a.mb)] = self._receive(a)

    def idle_fraction(self):
        """Share of the last step's wall time this rank spent outside forward/backward compute
        (waiting in transfers, or idle in the pipeline's bubble)."""
        if not self.last_timeline:
            return None
        span = self.last_timeline[-1][2] - self.last_timeline[0][1]
        busy = sum(end - start for a, start, end in self.last_timeline if a.kind in schedules.COMPUTE)
        return 1.0 - busy / span if span > 0 else 0.0


def _handoff(t):
    """A stage output as the next stage's input on the same rank: detached, a leaf that
    collects its gradient like a received tensor."""
    if not isinstance(t, torch.Tensor):
        return t
    d = t.detach()
    return d.requires_grad_() if t.requires_grad else d


class ScheduleGPipe(_PipelineScheduleBase):
    """All forwards, then all backwards (one stage per rank)."""

    _kind = "GPipe"


class Schedule1F1B(_PipelineScheduleBase):
    """One forward, one backward in the steady state (one stage per rank)."""

    _kind = "1F1B"


class ScheduleInterleaved1F1B(_PipelineScheduleBase):
    """1F1B over several stages per rank (stage s on pipeline rank s % p)."""

    _kind = "Interleaved1F1B"


class ScheduleInterleavedZeroBubble(_PipelineScheduleBase):
    """Interleaved 1F1B with the backward split into input gradient (I, on the critical
    path) and weight gradient (W, deferred to fill the bubbles)."""

    _kind = "InterleavedZeroBubble"
