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

import torch

from hvdlite.common import compressors as policy
from hvdlite.common import dtypes, exceptions
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

    def __init__(self, min_numel=policy.DEFAULT_MIN_NUMEL):
        self.min_numel = policy.check_positive_int(min_numel, "min_numel")
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
        corrected = self._corrected(name, tensor.detach())
        pending = self._start(name, corrected, plan, process_set)

        def finish():
            out = pending(scale)
            return out.view(tensor.shape).to(tensor.dtype)

        return _Pending(finish, pending.advance)

    def _admit(self, name, plan):
        """The plan of this step (PowerSGD's warm-up sends uncompressed)."""
        return plan

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
        """This rank's residual for gradient `name` (None before its first compressed step)."""
        return self._state.local_of(name).get("residual")

    def state_dict(self):
        return self._state.state_dict()

    def load_state_dict(self, state):
        self._state.load_state_dict(state)


def _orthogonalize(mat, eps=1e-8):
    """Gram-Schmidt on the columns of `mat`, in place. Deterministic: the same input gives
    the same bits on every rank, which is what keeps PowerSGD's replicas identical."""
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

    def __init__(self, rank=4, start_step=10, min_numel=policy.DEFAULT_MIN_NUMEL):
        super().__init__(min_numel)
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
            q_local = mat.t() @ p
            local["residual"] = torch.addmm(mat, p, q_local.t(), alpha=-1.0).view(corrected.shape)
            second["q"] = q_local
            second["handle"] = mpi_ops.allreduce_async_(
                q_local, name=name + ".powersgd.q", op=dtypes.Sum, process_set=process_set
            )

        def finish(scale=1.0):
            mpi_ops.synchronize(second["handle"])
            shared["q"] = second["q"]
            return p @ (second["q"] * scale).t()

        return _Pending(finish, advance)
