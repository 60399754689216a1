"""ZeRO stage 3: parameters hold no storage outside forward/backward.

Each parameter keeps its full-shape tensor object (autograd saves it), but its storage is
resized to 0 bytes; this rank's part of it lives in the optimizer's fp32 master shard. A
module's buckets (its direct parameters, one bucket per module and param group) are
allgathered just before the module runs: by a forward pre-hook, and in backward by an
identity autograd function wrapped around the module's outputs, whose backward runs right
before the module's own. The storage is released after the module's forward, and after
backward once the bucket's gradients have been submitted.

Fixed collective schedule (no hang when module order differs or a submodule is skipped on
some ranks): within a phase (forward, backward) every bucket is gathered at most once under
the name `<prefix>.ag.<phase>.<bucket>`, in one schedule order shared by all ranks. Asking for
bucket b first issues every not-yet-issued bucket before b in the schedule, plus the next one
(prefetch); the end of the phase issues the rest. So every rank issues the same names, and a
rank never waits for a name it has not issued on ranks that wait on one it has not. The
schedule starts as registration order (reversed for backward) and after the first step is
rank 0's observed order. A bucket asked for again in a phase after it was released (a
module called twice, a tied weight) is gathered again under `<...>.x<n>`: ranks must agree
on such repeats.
"""

import torch
import torch.utils._pytree as pytree


def _free(p):
    p.data.untyped_storage().resize_(0)


class _PreBackward(torch.autograd.Function):
    """Identity whose backward gathers a module's buckets before the module's backward."""

    @staticmethod
    def forward(ctx, gatherer, buckets, *tensors):
        ctx.gatherer, ctx.buckets = gatherer, buckets
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        ctx.gatherer.request("b", ctx.buckets)
        return (None, None) + grads


class Stage3Gatherer:
    """Owns the gathered state of one stage-3 ZeroOptimizer's parameters. Called on the
    training thread and on autograd's (never both at once: backward blocks the caller)."""

    def __init__(self, zopt):
        self.z = zopt
        n = len(zopt.buckets)
        self.schedule = {"f": list(range(n)), "b": list(range(n - 1, -1, -1))}
        self.traces: dict[str, list[int]] = {"f": [], "b": []}
        self.phase: str = ""  # "f" forward, "b" backward, "" between phases
        self.held = {}  # bucket -> wait callable (issued, not materialized) or None (materialized)
        self.issued = set()
        self.ptr = 0
        self.repeats = {}
        dtype = zopt.compute_dtype or None
        for b in zopt.buckets:
            for s in b.slots:
                s.param.data = torch.empty(s.shape, dtype=dtype or s.param.dtype)
                _free(s.param)
        self.module_buckets = {}
        for module in zopt.model.modules():
            ids = sorted(
                {
                    zopt._slot_bucket[id(p)].index
                    for p in module.parameters(recurse=False)
                    if id(p) in zopt._slot_bucket
                }
            )
            if ids:
                self.module_buckets[module] = ids
        root = zopt.model
        root.register_forward_pre_hook(lambda m, a: self.begin("f"))
        for module, ids in self.module_buckets.items():
            module.register_forward_pre_hook(self._make_pre(ids))
            module.register_forward_hook(self._make_post(ids))
        root.register_forward_hook(lambda m, a, o: self.end_phase("f"))

    # ---- hooks ----------------------------------------------------------------------------

    def _make_pre(self, ids):
        def pre(module, args):
            self.request("f" if self.phase != "b" else "b", ids)

        return pre

    def _make_post(self, ids):
        def post(module, args, output):
            if self.phase == "f":
                for b in ids:
                    self.release(b)
            if not torch.is_grad_enabled():
                return output
            flat, spec = pytree.tree_flatten(output)
            idx = [i for i, t in enumerate(flat) if torch.is_tensor(t) and t.requires_grad]
            if not idx:
                return output
            wrapped = _PreBackward.apply(self, ids, *[flat[i] for i in idx])
            for i, t in zip(idx, wrapped):
                flat[i] = t
            return pytree.tree_unflatten(flat, spec)

        return post

    # ---- schedule -------------------------------------------------------------------------

    def begin(self, phase):
        if self.phase:
            self.end_phase(self.phase)
        self.phase, self.ptr = phase, 0
        self.issued.clear()
        self.repeats.clear()

    def end_phase(self, phase):
        """Issues what this phase's schedule has left, waits, and releases everything."""
        if self.phase != phase:
            return
        for b in self.schedule[phase]:
            if b not in self.issued:
                self._issue(b)
        for b in list(self.held):
            self.release(b)
        self.phase = ""

    def end_backward(self):
        if self.phase == "b":
            self.end_phase("b")
        elif self.phase == "f":  # forward without backward before step(): close it
            self.end_phase("f")

    def request(self, phase, ids):
        if self.phase != phase:
            self.begin(phase)
        trace = self.traces[phase]
        for b in ids:
            if self.z._steps == 0 and b not in trace:
                trace.append(b)
            self._ensure_issued(b)
        self._prefetch()
        for b in ids:
            self._materialize(b)

    def _ensure_issued(self, b):
        if b in self.held:
            return
        if b in self.issued:  # asked for again after release: an extra gather
            n = self.repeats.get(b, 0) + 1
            self.repeats[b] = n
            self._issue(b, "%s.ag.%s.%d.x%d" % (self.z.prefix, self.phase, b, n))
            return
        order = self.schedule[self.phase]
        while self.ptr < len(order):
            nxt = order[self.ptr]
            self.ptr += 1
            if nxt not in self.issued:
                self._issue(nxt)
            if nxt == b:
                return

    def _prefetch(self):
        order = self.schedule[self.phase]
        while self.ptr < len(order) and order[self.ptr] in self.issued:
            self.ptr += 1
        if self.ptr < len(order):
            self._issue(order[self.ptr])
            self.ptr += 1

    def _issue(self, b, name=None):
        self.issued.add(b)
        name = name or "%s.ag.%s.%d" % (self.z.prefix, self.phase, b)
        self.held[b] = self.z.gather_bucket_async(self.z.buckets[b], name)

    def _materialize(self, b):
        wait = self.held.get(b)
        if wait is None:
            return
        full = wait()
        self.held[b] = None
        with torch.no_grad():
            for s in self.z.buckets[b].slots:
                p = s.param
                p.data.untyped_storage().resize_(s.numel * p.element_size())
                p.data.copy_(full[s.offset : s.offset + s.numel].view(s.shape))

    def release(self, b):
        if b not in self.held:
            return
        wait = self.held.pop(b)
        if wait is not None:
            wait()  # an issued gather must complete before its buffers go
        for s in self.z.buckets[b].slots:
            _free(s.param)

    def grads_done(self, b):
        if self.phase == "b":
            self.release(b)

    def after_step(self, steps_before):
        self.end_backward()
        if steps_before == 0:
            traces = self.z.schedule_from_root(self.traces)
            for phase in ("f", "b"):
                seen = list(traces[phase])
                rest = [b for b in self.schedule[phase] if b not in seen]
                self.schedule[phase] = seen + rest
