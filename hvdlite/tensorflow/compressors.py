"""The stateful compressors for TensorFlow gradients: ``Compression.topk`` and
``Compression.sign`` (policy shared with torch: hvdlite/common/compressors.py), for
DistributedGradientTape and the DistributedOptimizers, eager or inside tf.function.

A compressor is a tf.Module: its residuals are tf.Variables (one per gradient name,
created outside any graph on first use), so ``tf.train.Checkpoint(compression=c)`` saves
and restores them. ``reduce`` runs from the thread that computes the gradients; inside
tf.function its collectives are stateful ops ordered after the residual's read and
before its assignment. Every rank sums the gathered contributions in rank order, so all
of them hold the same bits.
"""

import zlib

import numpy as np
import tensorflow as tf

from hvdlite.common import compressors as policy
from hvdlite.common import dtypes, exceptions
from hvdlite.tensorflow import raw_ops


class TFStatefulCompressor(tf.Module):
    """Base: error feedback per gradient name, and the plan of each gradient."""

    stateful = True
    method = ""

    def __init__(self, min_numel):
        super().__init__(name="hvdlite_%s" % self.method)
        self.min_numel = policy.check_positive_int(min_numel, "min_numel")
        self.residuals: dict[str, tf.Variable] = {}
        self.plans: dict[str, policy.Plan] = {}

    def compress(self, tensor):
        raise exceptions.NotSupportedError(
            "Compression.%s keeps state per gradient (error feedback) and runs its own collectives:"
            " pass it to DistributedGradientTape or DistributedOptimizer; allreduce() takes"
            " Compression.none, .fp16 or .bf16" % self.method
        )

    def decompress(self, tensor, ctx):
        return tensor

    def _plan(self, shape, is_float, itemsize, size):
        raise exceptions.NotSupportedError("%s must define _plan()" % type(self).__name__)

    def _residual(self, name, shape):
        var = self.residuals.get(name)
        if var is None:
            with tf.init_scope():  # a variable outside any tf.function's graph
                var = tf.Variable(tf.zeros(shape, tf.float32), trainable=False, name="residual")
            self.residuals[name] = var
        return var

    def reduce(self, name, grad, op, prescale, postscale, process_set):
        """`grad` reduced across process_set with compression and error feedback, or None
        when it goes uncompressed (the caller reduces it as it is)."""
        shape = tuple(int(d) for d in grad.shape)
        size = process_set.size()
        plan = self._plan(shape, grad.dtype.is_floating, grad.dtype.size, size)
        self.plans[name] = plan
        if plan.method == "none":
            return None
        policy.check_reduction(op, name)
        residual = self._residual(name, shape)
        flat = tf.reshape(tf.cast(grad, tf.float32) + residual, [-1])
        sent, wire = self._compress(flat, shape)
        residual.assign(tf.reshape(flat - sent, shape))
        if plan.collective == "allgather":
            gathered = tf.reshape(
                raw_ops.allgather([wire], ["%s.%s" % (name, self.method)], process_set)[0], [size, -1]
            )
            total = self._decode(gathered[0], flat, shape)
            for r in range(1, size):
                total = total + self._decode(gathered[r], flat, shape)
        else:
            total = raw_ops.allreduce(
                [sent], ["%s.%s" % (name, self.method)], dtypes.Sum, 1.0, 1.0, process_set
            )[0]
        scale = policy.output_scale(op, prescale, postscale, size)
        return tf.cast(tf.reshape(total * scale, shape), grad.dtype)


class TFTopKCompressor(TFStatefulCompressor):
    """Top-k with error feedback: the k = ratio x numel entries of largest magnitude travel
    as int32 indices and float32 values in one allgather (an exact tf.math.top_k here,
    not the sampled threshold of the torch compressor)."""

    method = "topk"

    def __init__(self, ratio=0.01, min_numel=policy.DEFAULT_MIN_NUMEL):
        super().__init__(min_numel)
        self.ratio = policy.check_ratio(ratio)

    def _plan(self, shape, is_float, itemsize, size):
        return policy.topk_plan(shape, is_float, itemsize, self.ratio, size, self.min_numel)

    def _compress(self, flat, shape):
        k = policy.topk_count(int(flat.shape[0]), self.ratio)
        index = tf.math.top_k(tf.abs(flat), k, sorted=False).indices
        values = tf.gather(flat, index)
        sent = tf.scatter_nd(index[:, None], values, tf.shape(flat))
        wire = tf.concat([index, tf.bitcast(values, tf.int32)], 0)
        return sent, wire

    def _decode(self, segment, flat, shape):
        k = policy.topk_count(int(flat.shape[0]), self.ratio)
        # Indices within one rank are distinct: one addition per entry.
        return tf.scatter_nd(segment[:k, None], tf.bitcast(segment[k:], tf.float32), tf.shape(flat))


_WEIGHTS = [1, 2, 4, 8, 16, 32, 64, 128]


class TFSignCompressor(TFStatefulCompressor):
    """Scaled sign with error feedback: per chunk of whole rows, the signs packed 8 to a byte
    and one float32 scale (the chunk's mean magnitude), in one uint8 allgather."""

    method = "sign"

    def __init__(self, chunk=policy.DEFAULT_SIGN_CHUNK, min_numel=policy.DEFAULT_MIN_NUMEL):
        super().__init__(min_numel)
        self.chunk = policy.check_positive_int(chunk, "sign chunk")

    def _plan(self, shape, is_float, itemsize, size):
        return policy.sign_plan(shape, is_float, itemsize, self.chunk, size, self.min_numel)

    def _scaled(self, signs, scales, shape):
        """signs (n values, 1 for +, 0 for -) times their chunk's scale."""
        chunk, chunks = policy.sign_layout(shape, self.chunk)
        n = int(np.prod(shape))
        signs = tf.reshape(signs, [n])
        padded = tf.pad(signs * 2.0 - 1.0, [[0, chunk * chunks - n]])
        return tf.reshape(tf.reshape(padded, [chunks, chunk]) * scales[:, None], [-1])[:n]

    def _compress(self, flat, shape):
        chunk, chunks = policy.sign_layout(shape, self.chunk)
        n = int(flat.shape[0])
        magnitude = tf.reshape(tf.pad(tf.abs(flat), [[0, chunk * chunks - n]]), [chunks, chunk])
        counts = tf.constant([float(chunk)] * (chunks - 1) + [float(n - (chunks - 1) * chunk)])
        scales = tf.reduce_sum(magnitude, 1) / counts
        positive = tf.cast(flat >= 0, tf.float32)
        sent = self._scaled(positive, scales, shape)
        nbytes = 4 * (-(-n // 32))
        bits = tf.reshape(tf.pad(tf.cast(positive, tf.uint8), [[0, nbytes * 8 - n]]), [nbytes, 8])
        packed = tf.reduce_sum(bits * tf.constant(_WEIGHTS, tf.uint8), 1)
        wire = tf.concat([packed, tf.reshape(tf.bitcast(scales, tf.uint8), [-1])], 0)
        return sent, wire

    def _decode(self, segment, flat, shape):
        _, chunks = policy.sign_layout(shape, self.chunk)
        n = int(flat.shape[0])
        nbytes = 4 * (-(-n // 32))
        shifts = tf.constant(list(range(8)), tf.uint8)
        bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(segment[:nbytes, None], shifts), 1)
        signs = tf.cast(tf.reshape(bits, [-1])[:n], tf.float32)
        scales = tf.bitcast(tf.reshape(segment[nbytes:], [chunks, 4]), tf.float32)
        return self._scaled(signs, scales, shape)


def _orthogonalize(p, eps=1e-8):
    """Gram-Schmidt on the columns of p (deterministic: the same bits on every rank)."""
    columns: list[tf.Tensor] = []
    for i in range(int(p.shape[1])):
        col = p[:, i : i + 1]
        for prev in columns:
            col = col - prev * tf.reduce_sum(prev * col)
        columns.append(col / (tf.norm(col) + eps))
    return tf.concat(columns, 1)


class TFPowerSGDCompressor(TFStatefulCompressor):
    """PowerSGD as in hvdlite/torch/compressors.py: P = M Q and Q = M^T P (after P is
    orthogonalized) travel as two allreduces; Q is kept between steps (a tf.Variable,
    seeded by the gradient's name); the first `start_step` steps of each gradient go
    uncompressed (a tf.cond on a step counter, the same on every rank)."""

    method = "powersgd"

    def __init__(self, rank=4, start_step=10, min_numel=policy.DEFAULT_MIN_NUMEL):
        super().__init__(min_numel)
        self.rank = policy.check_positive_int(rank, "powersgd rank")
        self.start_step = policy.check_positive_int(start_step, "powersgd start_step", minimum=0)
        self.qs: dict[str, tf.Variable] = {}
        self.steps: dict[str, tf.Variable] = {}

    def _plan(self, shape, is_float, itemsize, size):
        return policy.powersgd_plan(shape, is_float, itemsize, self.rank, self.min_numel)

    def _shared(self, name, m, r):
        if name not in self.qs:
            seed = zlib.crc32(name.encode("utf-8"))
            initial = np.random.default_rng(seed).standard_normal((m, r)).astype(np.float32)
            with tf.init_scope():
                self.qs[name] = tf.Variable(initial, trainable=False, name="q")
                self.steps[name] = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        return self.qs[name], self.steps[name]

    def reduce(self, name, grad, op, prescale, postscale, process_set):
        shape = tuple(int(d) for d in grad.shape)
        size = process_set.size()
        plan = self.plans[name] = self._plan(shape, grad.dtype.is_floating, grad.dtype.size, size)
        if plan.method == "none":
            return None
        policy.check_reduction(op, name)
        n, m = policy.matrix_shape(shape)
        r = min(self.rank, n, m)
        residual = self._residual(name, shape)
        q, step = self._shared(name, m, r)
        mat = tf.reshape(tf.cast(grad, tf.float32) + residual, [n, m])

        def compressed():
            p = raw_ops.allreduce([mat @ q], [name + ".powersgd.p"], dtypes.Sum, 1.0, 1.0, process_set)[0]
            p = _orthogonalize(tf.reshape(p, [n, r]))
            q_local = tf.transpose(mat) @ p
            residual.assign(tf.reshape(mat - p @ tf.transpose(q_local), shape))
            q_sum = raw_ops.allreduce([q_local], [name + ".powersgd.q"], dtypes.Sum, 1.0, 1.0, process_set)[0]
            q_sum = tf.reshape(q_sum, [m, r])
            q.assign(q_sum)
            return p @ tf.transpose(q_sum)

        def plain():
            return tf.reshape(raw_ops.allreduce([mat], [name], dtypes.Sum, 1.0, 1.0, process_set)[0], [n, m])

        total = tf.cond(step >= self.start_step, compressed, plain)
        step.assign_add(1)
        scale = policy.output_scale(op, prescale, postscale, size)
        return tf.cast(tf.reshape(total * scale, shape), grad.dtype)
