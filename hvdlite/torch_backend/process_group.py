"""The "hvdlite" process group: torch.distributed's calls as hvdlite core operations.

A group is an hvdlite process set (the default group: the global set). Each torch call becomes
one submission per tensor through ``hvdlite.common.collectives`` with the torch adapter's
buffers, as ``hvd.*`` calls are, and returns a ``HvdliteWork``.

Naming (the schedule): torch requires every member of a group to issue the group's collectives
in the same order, so a name derived from that order agrees across members without any
exchange: ``c10d.<set>.<kind>.<signature>.<n mod SLOTS>``, where n counts this group's calls of
that kind and signature (a group sharing the world's set adds torch's group name after <set>).
Repeating names let the core's response cache and steady state replay a training loop's
decisions instead of negotiating them. A rank whose call would reuse a name
still in flight first waits for that earlier call (it precedes this one in the order every
member follows, so every member has submitted it: the wait cannot deadlock). Members that
diverge (another kind, dtype or size at the same position) submit different names; the core's
deadlock detector then fails both calls on every member with a MismatchError naming what each
rank waits for, and the group stays usable.
"""

import threading
import warnings

import torch
import torch.distributed as dist

from hvdlite.common import basics, collectives, dtypes, exceptions, ops, p2p, process_sets
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch.buffers import CODES, TORCH
from hvdlite.torch_backend import joining
from hvdlite.torch_backend.work import DoneWork, HvdliteWork, _settle

# How many calls of one kind and signature may be in flight before the next waits for the
# oldest (see the module doc).
SLOTS = 8
# Group timeouts from this long up leave blocking calls to the core's own bounds (the transport
# timeout, the liveness check), which are shorter; torch's default is 30 minutes.
FAST_PATH_MIN_TIMEOUT_S = 600.0

_R = dist.ReduceOp.RedOpType
# By the RedOpType's integer value: hashing and comparing torch's enum objects costs microseconds.
_REDUCE = {int(_R.SUM): dtypes.Sum, int(_R.AVG): dtypes.Average, int(_R.MIN): dtypes.Min}
_REDUCE.update({int(_R.MAX): dtypes.Max, int(_R.PRODUCT): dtypes.Product})
_PREMUL_SUM = int(_R.PREMUL_SUM)


def _reduction(reduce_op, what):
    """(hvdlite ReduceOp, prescale) of a torch ReduceOp (PREMUL_SUM: Sum after scaling)."""
    kind = int(getattr(reduce_op, "op", reduce_op))
    op = _REDUCE.get(kind)
    if op is not None:
        return op, 1.0
    if kind == _PREMUL_SUM:
        factor = reduce_op.factor if hasattr(reduce_op, "factor") else 1.0
        if isinstance(factor, torch.Tensor):
            factor = float(factor.item())
        return dtypes.Sum, float(factor)
    raise exceptions.NotSupportedError(
        "%s: the hvdlite backend reduces with SUM, AVG, MIN, MAX, PRODUCT and PREMUL_SUM, not %s"
        % (what, reduce_op)
    )


def _dtype_label(tensor):
    code = CODES.get(tensor.dtype)
    return dtypes.NAMES[code] if code is not None else str(tensor.dtype)


def _signature(tensor):
    """What members must agree on for an elementwise collective: dtype and element count (the
    names of divergent calls then say what differs: 'float32x4' against 'float32x5')."""
    return "%sx%d" % (_dtype_label(tensor), tensor.numel())


def _flat(tensor):
    return tensor.reshape(-1)


def _into_one(output):
    """then() for a call whose result fills `output`."""

    def then(result):
        output.copy_(result.view(output.shape))
        return [output]

    return then


def _into_list(outputs):
    """then() for a call whose flat result fills `outputs` in order (the list forms)."""

    def then(flat):
        offset = 0
        for out in outputs:
            out.copy_(flat[offset : offset + out.numel()].view(out.shape))
            offset += out.numel()
        return outputs

    return then


class HvdliteProcessGroup(dist.ProcessGroup):
    """One torch process group over the hvdlite process set `process_set` (members: global
    ranks in group-rank order). Thread-safety: torch issues a group's calls from one thread at a
    time; the works it returns may complete on the completer thread."""

    def __init__(self, rank, size, process_set, group_name, timeout, shares_set=False):
        super().__init__(rank, size)
        # The group's timeout bounds every wait on its works. A blocking call submits and waits
        # in one call into the core, bounded by the core's own timeouts, unless the group asked
        # for a shorter bound than those leave it.
        self._timeout_s = timeout.total_seconds()
        self._blocking_fast_path = self._timeout_s >= FAST_PATH_MIN_TIMEOUT_S
        self._set = process_set
        self._set_id = process_set.process_set_id
        self._members = process_set.ranks
        self._counts = {}
        # name -> the work using it until that work completes (then _forget drops it, so a
        # finished call's tensors are not kept alive here). Written by the calling thread and by
        # whichever thread completes a work: under _in_flight_lock.
        self._in_flight = {}
        self._in_flight_lock = threading.Lock()
        # Several torch groups may map onto one set (the world and a new_group of every rank,
        # shares_set): those name their calls apart by torch's group name (the same on every
        # member), so their calls in flight at once never share a name.
        self._name_prefix = "c10d.%d.%s" % (self._set_id, "%s." % group_name if shares_set else "")
        self._group_label = group_name
        self._closed = False  # set by shutdown(): later calls raise instead of reaching a freed id

    # ---- identity ----

    def getBackendName(self):
        return "hvdlite"

    @property
    def group_name(self):
        return self._group_label

    def __repr__(self):
        return "HvdliteProcessGroup(set %d, ranks %s)" % (self._set_id, self._members)

    # ---- lifetime ----

    def shutdown(self):
        """torch's destroy_process_group(group) calls this on the group; destroying the world
        calls it on every group of this rank, in the order of their names (the same on every
        rank). A subgroup's process set is removed here among its members only: removal is
        collective over the members, and this is a point every member reaches in the same order
        relative to its other calls (a finalizer would run at an unordered time, on any thread).
        Calls in flight on the group still complete: every member submitted them before its
        removal, so the core decides and runs them first. Blocks until every member has destroyed the group; one that never does fails the others
        after HVDLITE_STALL_SHUTDOWN_TIME_SECONDS with a TimeoutError naming the set and the
        missing ranks (a runtime that has failed, e.g. after a peer died, only warns, so that
        torch's teardown completes). The global set (the default group) stays: hvd.* calls share it, and a
        later init_process_group("hvdlite") in this process joins the same runtime. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._set is global_process_set or not basics.is_initialized():
            return
        try:
            process_sets.remove_process_set_among_members(self._set)
        except exceptions.HvdliteError as e:
            if isinstance(e, ValueError) or "stalled for" in str(e):
                raise  # a misuse, or a member that never destroyed the group: the user's to fix
            # The runtime has failed (a peer died): it runs no collective any more, so the set
            # goes with it; raising would stop torch's teardown of the world half way.
            warnings.warn("%s: its process set was not removed: %s" % (self, e), stacklevel=2)

    # ---- naming ----

    def _name(self, kind, signature):
        if self._closed:
            raise exceptions.PreconditionError(
                "%s: %s on a destroyed torch.distributed group (destroy_process_group ran); "
                "create a new group" % (self, kind)
            )
        key = (kind, signature)
        n = self._counts.get(key, 0)
        self._counts[key] = n + 1
        name = "%s%s.%s.%d" % (self._name_prefix, kind, signature, n % SLOTS)
        earlier = self._in_flight.get(name)
        if earlier is not None and not earlier.is_completed():
            earlier._complete()
        return name

    def _track(self, names, work):
        with self._in_flight_lock:
            for name in names:
                self._in_flight[name] = work
        work.on_done = lambda done, names=names: self._forget(done, names)
        return self._bounded(work)

    def _forget(self, work, names):
        with self._in_flight_lock:
            for name in names:
                if self._in_flight.get(name) is work:
                    del self._in_flight[name]

    def _bounded(self, work):
        work.default_timeout_s = self._timeout_s
        return work

    # ---- submissions ----

    def _inplace(self, kind, op_type, tensors, **submit_kw):
        names = [self._name(kind, _signature(t)) for t in tensors]
        pendings = [
            collectives.inplace(TORCH, kind, op_type, t, n, process_set=self._set_id, **submit_kw)
            for t, n in zip(tensors, names)
        ]
        return self._track(names, HvdliteWork(pendings, lambda: [p.finish() for p in pendings]))

    def _with_output(self, kind, op_type, tensor, signature, then, into=None, **submit_kw):
        """One core operation with an output: written straight into `into` (torch's output
        tensor) where the core can write it (host memory, contiguous, the input's dtype), else
        into a buffer the core allocates, which then(output) copies where torch wants it. The
        work's result is the output tensors."""
        name = self._name(kind, signature)
        host = tensor.detach().cpu() if tensor.is_cuda else tensor
        if into is not None and into.dtype == host.dtype and TORCH.host_direct(into) is not None:
            pending = collectives.with_output(
                TORCH, kind, op_type, host, name, out=into, process_set=self._set_id, **submit_kw
            )
            return self._track([name], HvdliteWork([pending], lambda: pending.finish() and [into]))
        pending = collectives.with_output(
            TORCH, kind, op_type, host, name, process_set=self._set_id, **submit_kw
        )
        return self._track([name], HvdliteWork([pending], lambda: then(pending.finish()[0])))

    def allreduce(self, tensors, opts=None):
        op, prescale = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "all_reduce")
        if (
            self._blocking_fast_path
            and opts is not None
            and not opts.asyncOp
            and len(tensors) == 1
            and tensors[0].is_cpu
        ):
            t = tensors[0]  # a blocking call: submit and wait in one call into the core
            name = self._name("allreduce", _signature(t))
            collectives.inplace_sync(
                TORCH, "allreduce", ops.ALLREDUCE, t, name, op, prescale, 1.0, 0, self._set_id
            )
            return DoneWork(tensors)
        return self._inplace("allreduce", ops.ALLREDUCE, tensors, reduce_op=op, prescale=prescale)

    def allreduce_coalesced(self, tensors, opts=None):
        op, prescale = _reduction(opts.reduceOp, "all_reduce_coalesced")
        return self._inplace("allreduce", ops.ALLREDUCE, tensors, reduce_op=op, prescale=prescale)

    def broadcast(self, tensors, opts):
        root = self._members[opts.rootRank]
        return self._inplace("broadcast", ops.BROADCAST, tensors, root=root)

    def reduce(self, tensors, opts):
        """Reduces onto the group rank opts.rootRank; other members' tensors stay unchanged."""
        op, prescale = _reduction(opts.reduceOp, "reduce")
        t = tensors[0]
        target = t if self.rank() == opts.rootRank else t.detach().clone()
        work = self._inplace("allreduce", ops.ALLREDUCE, [target], reduce_op=op, prescale=prescale)
        return work

    def all_gather_single(self, output, input, opts=None):
        then = _into_one(output)
        return self._with_output(
            "allgather", ops.ALLGATHER, _flat(input), _signature(input), then, into=output
        )

    _allgather_base = all_gather_single

    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs, source = output_tensors[0], input_tensors[0]
        return self._with_output(
            "allgather", ops.ALLGATHER, _flat(source), _signature(source), _into_list(outputs)
        )

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return _CombinedWork([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return _CombinedWork([self.allgather([o], [i], opts) for o, i in zip(output_lists, inputs)])

    def reduce_scatter_single(self, output, input, opts=None):
        op, prescale = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter")
        rows = input.reshape(self.size(), -1)

        then = _into_one(output)
        return self._with_output(
            "reducescatter",
            ops.REDUCESCATTER,
            rows,
            _signature(input),
            then,
            into=output,
            reduce_op=op,
            prescale=prescale,
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        output, pieces = output_tensors[0], input_tensors[0]
        stacked = torch.cat([_flat(p) for p in pieces]).view(self.size(), -1)
        return self.reduce_scatter_single(output, stacked, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return _CombinedWork([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        splits = list(input_split_sizes) if len(input_split_sizes) else []

        then = _into_one(output)
        signature = _dtype_label(input)
        return self._with_output("alltoall", ops.ALLTOALL, input, signature, then, into=output, splits=splits)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        flat = torch.cat([_flat(t) for t in input_tensors]) if input_tensors else torch.empty(0)
        splits = [t.numel() for t in input_tensors]

        then = _into_list(output_tensors)
        return self._with_output("alltoall", ops.ALLTOALL, flat, _dtype_label(flat), then, splits=splits)

    def gather(self, output_tensors, input_tensors, opts):
        """All members send; the group rank opts.rootRank keeps the list (an allgather)."""
        outputs = output_tensors[0] if self.rank() == opts.rootRank else []
        source = input_tensors[0]
        return self._with_output(
            "allgather", ops.ALLGATHER, _flat(source), _signature(source), _into_list(outputs)
        )

    def scatter(self, output_tensors, input_tensors, opts):
        """The root's i-th input goes to member i: an alltoall in which only the root sends."""
        output = output_tensors[0]
        if self.rank() == opts.rootRank:
            pieces = input_tensors[0]
            flat = torch.cat([_flat(p) for p in pieces])
            splits = [p.numel() for p in pieces]
        else:
            flat = torch.empty(0, dtype=output.dtype)
            splits = [0] * self.size()

        then = _into_one(output)
        signature = _dtype_label(output)
        return self._with_output("scatter", ops.ALLTOALL, flat, signature, then, splits=splits)

    def barrier(self, opts=None):
        name = self._name("barrier", "")
        core = ops.submit(ops.BARRIER, name, 0, dtypes.UINT8, (0,), process_set=self._set_id)
        pending = collectives.Pending(core, lambda: ops.release(core), None)
        return self._track([name], HvdliteWork([pending], lambda: pending.finish() or []))

    # ---- point-to-point (matched by peer and tag; no name, no order) ----

    def send(self, tensors, dst_rank, tag):
        pendings = [p2p.post(TORCH, p2p.SEND, t, dst_rank, tag, self._set, "c10d.send") for t in tensors]
        return self._bounded(HvdliteWork(pendings, lambda: [p.finish() for p in pendings] and tensors))

    def recv(self, tensors, src_rank, tag):
        pendings = [p2p.post(TORCH, p2p.RECV, t, src_rank, tag, self._set, "c10d.recv") for t in tensors]
        return self._bounded(HvdliteWork(pendings, lambda: [p.finish() for p in pendings]))

    def recv_anysource(self, tensors, tag):
        raise exceptions.NotSupportedError(
            "recv from any source: the hvdlite backend matches messages by (source, tag); pass src="
        )


class _CombinedWork(HvdliteWork):
    """The works of one coalesced call as one: done when all are; outputs concatenated. Each
    part completes itself (exactly once, as any work)."""

    def __init__(self, works):
        super().__init__((), list)
        self._parts = works
        self.default_timeout_s = works[0].default_timeout_s if works else 0.0

    def _core_done(self):
        return all(w.is_completed() for w in self._parts)

    def _complete(self, deadline=None):
        if not all(w._complete(deadline) for w in self._parts):
            return False
        with self._lock:
            if not self._done:
                self._error = next((w._error for w in self._parts if w._error is not None), None)
                self._outputs = [t for w in self._parts for t in (w._outputs or [])]
                self._done = True
        if self._future is not None:
            _settle(self._future, self._outputs, self._error)
        return True


def create(dist_backend_opts, backend_options, cls=HvdliteProcessGroup):
    """torch's creator: joins the runtime for the default group, and maps the group onto a
    process set (a `cls`, HvdliteProcessGroup or a subclass)."""
    members = list(dist_backend_opts.global_ranks_in_group)
    rank, size = dist_backend_opts.group_rank, dist_backend_opts.group_size
    is_default = not members
    if is_default:
        joining.join(dist_backend_opts.store, rank, size, dist_backend_opts.timeout)
        members = list(range(size))
    if members == list(range(basics.size())):
        process_set = global_process_set
    else:
        process_set = _member_set(members)
    shares_set = process_set is global_process_set and not is_default
    name, timeout = dist_backend_opts.group_id, dist_backend_opts.timeout
    return cls(rank, size, process_set, name, timeout, shares_set=shares_set)


def _member_set(members):
    """The process set of a subgroup, registered by its members alone (torch creates a
    subgroup's backend on its members only). torch orders a group's ranks as given; hvdlite's
    set ranks ascend, so a group whose order differs would number its members differently."""
    if members != sorted(members):
        raise exceptions.NotSupportedError(
            "torch.distributed group with ranks %s: the hvdlite backend needs a group's ranks in "
            "ascending order (new_group sorts them; pass them sorted to split_group)" % (members,)
        )
    return process_sets.add_process_set_among_members(members)


__all__ = ["HvdliteProcessGroup", "create"]
