"""The stateful compressors for torch gradients: ``Compression.powersgd``, ``.topk`` and
``.sign`` (their policy, shared with every framework, is hvdlite/common/compressors.py).

A compressor instance belongs to one DistributedOptimizer, which calls ``start`` from
its gradient hook (the thread running backward) and completes the returned pending
gradient in ``synchronize``: ``advance()`` runs a middle stage where there is one
(PowerSGD's second allreduce), calling it waits and returns the reduced gradient. Every
wait is on a core handle, bounded by the core's timeouts. State (residuals, PowerSGD's
Q, step counters) is keyed by the gradient's name, which is the same on every rank.
"""

import zlib
from typing import Any

import torch

from hvdlite.common import compressors as policy
from hvdlite.common import dtypes, exceptions, topology
from hvdlite.common.objects import allgather_object
from hvdlite.common.process_sets import add_process_set_among_members, global_process_set
from hvdlite.torch import mpi_ops


class _Pending:
    """A compressed gradient in flight (a callable handle for mpi_ops.synchronize)."""

    def __init__(self, finish, advance=None):
        self._finish = finish
        self._advance = advance

    def advance(self):
        """Runs the middle stage once (blocking: it waits for the first collective)."""
        if self._advance is not None:
            stage, self._advance = self._advance, None
            stage()

    def __call__(self, *scale):
        """The reduced gradient; a compressor's inner pending takes the output scale, which
        it folds into its last small operation instead of a pass over the output."""
        self.advance()
        return self._finish(*scale)


class StatefulCompressor:
    """Base of the compressors that keep state per gradient and run their own
    collectives. Counts what it submits: ``bytes_submitted`` (this rank's payload, what
    went uncompressed included) against ``bytes_uncompressed`` (the float32 allreduce it
    replaced). ``plans`` says, per gradient name, how the last step sent it and why."""

    stateful = True
    method = ""

    def __init__(self, min_numel=policy.DEFAULT_MIN_NUMEL, cross_host_only=None):
        self.min_numel = policy.check_positive_int(min_numel, "min_numel")
        self.cross_host_only = policy.check_cross_host_only(cross_host_only)
        self._two_level_sets: Any = None  # (local set, cross set or None) once decided; False: flat
        self._state = policy.CompressorState()
        self.plans: dict[str, policy.Plan] = {}
        self._plan_keys: dict[str, tuple[object, ...]] = {}
        self.bytes_submitted = 0
        self.bytes_uncompressed = 0

    def __repr__(self):
        return "Compression.%s(%s)" % (self.method, self._describe())

    def _describe(self):
        return "min_numel=%d" % self.min_numel

    def compress(self, tensor):
        raise exceptions.NotSupportedError(
            "%r keeps state per gradient (error feedback) and runs its own collectives: pass it to"
            " hvd.DistributedOptimizer(compression=...); allreduce() and the other collectives take"
            " Compression.none, .fp16 or .bf16" % (self,)
        )

    def decompress(self, tensor, ctx):
        return tensor  # start()'s pending gradient is already decompressed

    def plan(self, name, tensor, size):
        key = (tuple(tensor.shape), tensor.dtype, size)
        if self._plan_keys.get(name) != key:
            shape, is_float = tuple(tensor.shape), tensor.dtype.is_floating_point
            self.plans[name] = self._plan(shape, is_float, tensor.element_size(), size)
            self._plan_keys[name] = key
        return self.plans[name]

    def _plan(self, shape, is_float, itemsize, size):
        raise exceptions.NotSupportedError("%s must define _plan()" % type(self).__name__)

    def start(self, name, tensor, op, prescale, postscale, process_set):
        """Submits gradient `tensor` of gradient `name`; returns a pending gradient, or
        None when the tensor goes uncompressed (the caller allreduces it as it is)."""
        sets = self._two_level(process_set)
        if sets:
            return self._start_two_level(name, tensor, op, prescale * postscale, process_set, sets)
        size = process_set.size()
        plan = self.plan(name, tensor, size)
        if plan.method != "none":
            policy.check_reduction(op, name)
            plan = self._admit(name, plan)
        self.bytes_uncompressed += plan.dense_bytes
        self.bytes_submitted += plan.wire_bytes
        if plan.method == "none":
            return None
        scale = policy.output_scale(op, prescale, postscale, size)
        pending = self._start_from_grad(name, tensor.detach(), plan, process_set)
        # The result is written into the gradient itself where it is float32 and contiguous
        # (as the uncompressed allreduce does): no copy into p.grad afterwards. Nothing
        # reads the gradient once _start_from_grad returned.
        in_place = tensor.dtype == torch.float32 and tensor.is_contiguous() and not tensor.is_sparse
        into = tensor.detach().view(-1) if in_place else None

        def finish():
            out = pending(scale, into)
            return tensor if out is into else out.view(tensor.shape).to(tensor.dtype)

        return _Pending(finish, pending.advance)

    def _two_level(self, process_set):
        """(local set, cross set or None) when this compressor compresses the cross-host stage
        only, else False. Decided once, at the first compressed gradient (collective over the
        job: every rank's first start() comes to it): two levels when cross_host_only is not
        False, the reduction is over the whole job, and the job has 2+ hosts each holding
        the same number (2+) of consecutive ranks; the local set is this host's ranks, the
        cross set the hosts' local rank 0s (None on the other ranks). Sets are registered
        among their members only."""
        if self._two_level_sets is None:
            self._two_level_sets = False
            if self.cross_host_only is not False and process_set == global_process_set:
                layout = (
                    topology.rank(),
                    topology.local_rank(),
                    topology.local_size(),
                    topology.cross_rank(),
                )
                every = allgather_object(layout, name="hvdlite.compression.hosts")
                local, cross = policy.two_level_layout(every)
                if local is None and self.cross_host_only:
                    raise exceptions.PreconditionError(
                        "%r: cross_host_only=True needs 2+ hosts each running the same number (2+) of"
                        " consecutive ranks; this job's (rank, local rank, local size, host) are %s:"
                        " pass cross_host_only=None or False" % (self, every)
                    )
                if local is not None:
                    mine = local[topology.cross_rank()]
                    local_set = add_process_set_among_members(mine)
                    cross_set = add_process_set_among_members(cross) if topology.rank() in cross else None
                    self._two_level_sets = (local_set, cross_set)
        return self._two_level_sets

    def _start_two_level(self, name, tensor, op, scale_factor, process_set, sets):
        """Exact sum inside the host (local set), the compressor on the host sums among the
        hosts' local rank 0s (cross set), then a broadcast inside the host: so every replica
        gets local rank 0's bits, which are equal on every host."""
        local_set, cross_set = sets
        plan = self.plan(name, tensor, topology.cross_size())
        if plan.method != "none":
            policy.check_reduction(op, name)
            plan = self._admit(name, plan)
        if plan.method == "none":
            return None  # the core's own (two-level) allreduce, exact
        if cross_set is not None:  # bytes that cross hosts: the local rank 0s' only
            self.bytes_uncompressed += plan.dense_bytes
            self.bytes_submitted += plan.wire_bytes
        scale = policy.output_scale(op, scale_factor, 1.0, process_set.size())
        host_sum = tensor.detach().to(torch.float32, copy=True).contiguous()
        local = mpi_ops.allreduce_async_(host_sum, name=name + ".host", op=dtypes.Sum, process_set=local_set)
        root = local_set.ranks[0]
        stage = {}

        def advance():
            mpi_ops.synchronize(local)
            if cross_set is not None:
                stage["inner"] = self._start_from_grad(name, host_sum, plan, cross_set)

        def finish():
            # host_sum is free once _start_from_grad read it: the cross-host result lands in it.
            out = stage["inner"](scale, host_sum.view(-1)) if cross_set is not None else host_sum
            out = out.contiguous()
            out = mpi_ops.broadcast_(out.view(-1), root, name=name + ".hostbcast", process_set=local_set)
            return out.view(tensor.shape).to(tensor.dtype)

        return _Pending(finish, advance)

    def _admit(self, name, plan):
        """The plan of this step (PowerSGD's warm-up sends uncompressed)."""
        return plan

    def _start_from_grad(self, name, grad, plan, process_set):
        """_start on gradient + this rank's residual (error feedback). A compressor that adds
        the residual in its own pass overrides this; either way `grad` is read only before
        this returns."""
        return self._start(name, self._corrected(name, grad), plan, process_set)

    def _corrected(self, name, grad):
        """Error feedback: a new float32 tensor, gradient + this rank's residual."""
        residual = self._state.local_of(name).get("residual")
        if residual is None:
            return grad.to(torch.float32, copy=True).contiguous()
        # One pass, into a new tensor (torch.add promotes a half gradient to float32).
        return torch.add(residual.to(grad.device), grad).contiguous()

    def _start(self, name, corrected, plan, process_set):
        raise exceptions.NotSupportedError("%s must define _start()" % type(self).__name__)

    def residual(self, name):
        """This rank's residual for gradient `name` (None before its first compressed step):
        the live tensor, which a later step may overwrite in place (clone it to keep it)."""
        return self._state.local_of(name).get("residual")

    def state_dict(self):
        return self._state.state_dict()

    def load_state_dict(self, state):
        # An elastic reset reloads the state in a new job: decide the two levels (hosts) again.
        self._two_level_sets = None
        self._state.load_state_dict(state)


def _orthogonalize(mat, eps=1e-8):
    """Orthonormal columns spanning `mat`'s, in place. Deterministic: the same input gives the
    same bits on every rank, which is what keeps PowerSGD's replicas identical. On the CPU a
    Householder QR (one LAPACK call, 10x faster than the column loop on an n x 4 matrix; a
    zero column gets some unit vector orthogonal to the others, which P Q^T with Q = M^T P
    leaves exact); elsewhere Gram-Schmidt, a zero column staying zero."""
    if mat.device.type == "cpu":
        mat.copy_(torch.linalg.qr(mat).Q)
        return
    for i in range(mat.shape[1]):
        col = mat[:, i : i + 1]
        col.div_(col.norm() + eps)
        if i + 1 < mat.shape[1]:
            rest = mat[:, i + 1 :]
            rest.sub_(col @ (col.t() @ rest))


class PowerSGDCompressor(StatefulCompressor):
    """PowerSGD (Vogels et al., 2019): a gradient viewed as an n x m matrix M (with this
    rank's residual added) is sent as two allreduces, P = M Q (n x r) and, after P is
    orthogonalized, Q = M^T P (m x r); every rank rebuilds P Q^T. Q is kept between
    steps (warm start) and starts from a seed of the gradient's name, equal on every
    rank. The residual is M - P (M^T P)^T, exactly what this rank's share left out.
    The first `start_step` steps of each gradient go uncompressed."""

    method = "powersgd"

    def __init__(self, rank=4, start_step=10, min_numel=policy.DEFAULT_MIN_NUMEL, cross_host_only=None):
        super().__init__(min_numel, cross_host_only)
        self.rank = policy.check_positive_int(rank, "powersgd rank")
        self.start_step = policy.check_positive_int(start_step, "powersgd start_step", minimum=0)

    def _describe(self):
        return "rank=%d, start_step=%d, min_numel=%d" % (self.rank, self.start_step, self.min_numel)

    def _plan(self, shape, is_float, itemsize, size):
        return policy.powersgd_plan(shape, is_float, itemsize, self.rank, self.min_numel)

    def _admit(self, name, plan):
        shared = self._state.shared_of(name)
        step = shared.get("step", 0)
        shared["step"] = step + 1
        if step < self.start_step:
            return policy.Plan(
                "none",
                "warm-up step %d of %d" % (step, self.start_step),
                "allreduce",
                plan.dense_bytes,
                plan.dense_bytes,
            )
        return plan

    def _initial_q(self, name, m, r, device):
        generator = torch.Generator().manual_seed(zlib.crc32(name.encode("utf-8")))
        return torch.randn(m, r, generator=generator).to(device)

    def _start(self, name, corrected, plan, process_set):
        n, m = policy.matrix_shape(corrected.shape)
        r = min(self.rank, n, m)
        mat = corrected.view(n, m)
        shared, local = self._state.shared_of(name), self._state.local_of(name)
        q = shared.get("q")
        if q is None or tuple(q.shape) != (m, r):
            q = self._initial_q(name, m, r, mat.device)
        p = mat @ q.to(mat.device)
        p_handle = mpi_ops.allreduce_async_(
            p, name=name + ".powersgd.p", op=dtypes.Sum, process_set=process_set
        )
        second = {}

        def advance():
            mpi_ops.synchronize(p_handle)
            _orthogonalize(p)
            # (P^T M)^T: M read along its rows (2x faster than M^T P on the CPU).
            q_local = (p.t() @ mat).t().contiguous()
            # mat is the compressor's own new tensor (_corrected): the residual M - P Q^T is
            # computed in place, one pass, and stored (never mutated afterwards).
            local["residual"] = mat.addmm_(p, q_local.t(), alpha=-1.0).view(corrected.shape)
            second["q"] = q_local
            second["handle"] = mpi_ops.allreduce_async_(
                q_local, name=name + ".powersgd.q", op=dtypes.Sum, process_set=process_set
            )

        def finish(scale=1.0, out=None):
            """P (scale Q)^T, written into `out` (flat, n x m float32) when given."""
            mpi_ops.synchronize(second["handle"])
            shared["q"] = second["q"]
            q_scaled = (second["q"] * scale).t()
            if out is None:
                return p @ q_scaled
            torch.mm(p, q_scaled, out=out.view(n, m))
            return out

        return _Pending(finish, advance)
