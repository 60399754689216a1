"""Gradients of hvdlite.tensorflow's collectives, DistributedGradientTape,
PartialDistributedGradientTape and DistributedOptimizer (Keras 3 and
tf.compat.v1 optimizers), eagerly and inside tf.function, on 2 real
processes (one job runs every check: TensorFlow's import dominates)."""

import numpy as np
from helpers import TF_SPAWN_ENV, run_pooled

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def _collective_grads(hvd, tf, graph):
    """d/dx of sum(collective(x) * c) for each collective; returns name -> gradient array."""
    r, n = hvd.rank(), hvd.size()
    x = tf.Variable(tf.fill([r + 1, 2], 1.0 + r))
    cases = {
        "allreduce_sum": lambda v: tf.reduce_sum(hvd.allreduce(v[:1] * 3.0, op=hvd.Sum, name="g.ar")),
        "allgather": lambda v: tf.reduce_sum(
            hvd.allgather(v, name="g.ag") * tf.reshape(tf.range(n * (n + 1), dtype=tf.float32), [-1, 2])
        ),
        "broadcast": lambda v: tf.reduce_sum(hvd.broadcast(v[:1], 0, name="g.bc")) * 4.0,
        "alltoall": lambda v: tf.reduce_sum(hvd.alltoall(tf.concat([v[:1]] * n, 0), name="g.a2a")) * 2.0,
        "reducescatter_sum": lambda v: tf.reduce_sum(
            hvd.reducescatter(tf.concat([v[:1]] * n, 0), op=hvd.Sum, name="g.rs")
        ),
        "grouped": lambda v: tf.add_n(
            [tf.reduce_sum(t) for t in hvd.grouped_allreduce([v[:1], v[:1] * 2.0], op=hvd.Sum)]
        ),
    }
    out = {}
    for key, loss_fn in cases.items():

        def grad(loss_fn=loss_fn):
            with tf.GradientTape() as tape:
                loss = loss_fn(x)
            return tape.gradient(loss, x)

        out[key] = (tf.function(grad)() if graph else grad()).numpy()
    return out


def _check_collective_grads(out, r, n):
    shape = (r + 1, 2)

    def first_row(value):
        grad = np.zeros(shape)
        grad[0] = value
        return grad

    np.testing.assert_allclose(out["allreduce_sum"], first_row(3.0 * n))
    offset = sum(k + 1 for k in range(r))
    np.testing.assert_allclose(
        out["allgather"], np.arange(n * (n + 1)).reshape(-1, 2)[offset : offset + r + 1]
    )
    np.testing.assert_allclose(out["broadcast"], first_row(4.0 if r == 0 else 0.0))
    np.testing.assert_allclose(out["alltoall"], first_row(2.0 * n))
    np.testing.assert_allclose(out["reducescatter_sum"], first_row(n * n))
    np.testing.assert_allclose(out["grouped"], first_row(3.0 * n))


def _tape_checks(hvd, tf):
    r, n = hvd.rank(), hvd.size()
    w = tf.Variable([1.0, 2.0])
    local = tf.keras.layers.Dense(1, kernel_initializer="ones")
    local.build((None, 1))

    def step(kind):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * (r + 1.0)) + tf.reduce_sum(local(tf.ones([1, 1]))) * (r + 1.0)
        if kind == "partial":
            tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
        else:
            tape = hvd.DistributedGradientTape(
                tape,
                op=hvd.Sum if kind == "sum" else hvd.Average,
                compression=hvd.Compression.fp16 if kind == "fp16" else hvd.Compression.none,
            )
        return tape.gradient(loss, [w] + local.trainable_weights)

    out = {}
    for kind in ("avg", "sum", "fp16", "partial"):
        out[kind] = [g.numpy() for g in step(kind)]
        out[kind + "_graph"] = [g.numpy() for g in tf.function(lambda kind=kind: step(kind))()]
    assert isinstance(hvd.DistributedGradientTape(tf.GradientTape()), tf.GradientTape)
    for kind in ("avg", "fp16"):
        for key in (kind, kind + "_graph"):
            np.testing.assert_allclose(out[key][0], [(n + 1) / 2.0] * 2)
    np.testing.assert_allclose(out["sum_graph"][0], [n * (n + 1) / 2.0] * 2)
    np.testing.assert_allclose(out["partial"][0], [(n + 1) / 2.0] * 2)
    np.testing.assert_allclose(out["partial"][1], [[(r + 1.0) / n]])  # local: not reduced, scaled by 1/size
    return out


def _optimizer_checks(hvd, tf):
    r, n = hvd.rank(), hvd.size()
    v = tf.Variable([0.0, 0.0])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=1.0))
    assert isinstance(opt, tf.keras.optimizers.SGD)
    opt.apply_gradients([(tf.constant([float(r), 1.0]), v)])
    np.testing.assert_allclose(v.numpy(), [-(n - 1) / 2.0, -1.0])
    tf.function(lambda: opt.apply_gradients([(tf.constant([float(r), 1.0]), v)]))()
    np.testing.assert_allclose(v.numpy(), [-(n - 1.0), -2.0])
    u = tf.Variable([0.0])
    v1 = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    grads = v1.compute_gradients(lambda: u * (r + 1.0), var_list=[u])
    np.testing.assert_allclose(grads[0][0].numpy(), [(n + 1) / 2.0])
    w = tf.Variable([0.0, 0.0])
    accumulating = hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate=1.0), backward_passes_per_step=2
    )
    step = tf.function(lambda: accumulating.apply_gradients([(tf.constant([float(r), 1.0]), w)]))
    for call, want in (
        (lambda: accumulating.apply_gradients([(tf.constant([float(r), 1.0]), w)]), [0.0, 0.0]),
        (step, [-(n - 1.0), -2.0]),  # the sum of 2 passes, averaged over ranks
        (step, [-(n - 1.0), -2.0]),
        (step, [-2.0 * (n - 1.0), -4.0]),
    ):
        call()
        np.testing.assert_allclose(w.numpy(), want)
    errors = []
    for call in (
        lambda: hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=2
        ),
        lambda: hvd.DistributedOptimizer(opt),
        lambda: hvd.DistributedOptimizer(object()),
    ):
        try:
            call()
            errors.append(None)
        except Exception as exc:
            errors.append(exc)
    names = [type(e).__name__ for e in errors]
    # backward_passes_per_step > 1 with a tf.compat.v1 optimizer: graphs only (eagerly refused).
    assert names == ["InvalidArgumentError", "InvalidArgumentError", "InvalidArgumentError"], errors
    assert all(isinstance(e, hvd.HvdliteError) for e in errors)
    assert all(isinstance(e, ValueError) for e in errors)  # Horovod raises ValueError


def _job():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    tf.get_logger().setLevel("ERROR")
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for graph in (False, True):
        _check_collective_grads(_collective_grads(hvd, tf, graph), r, n)
    tapes = _tape_checks(hvd, tf)
    _optimizer_checks(hvd, tf)
    hvd.shutdown()
    return {k: [g.tobytes() for g in v] for k, v in tapes.items() if not k.startswith("partial")}


def test_gradients_tapes_and_optimizers():
    results = run_pooled(_job, 2, timeout=240, env=TF_ENV, spawn_env=TF_SPAWN_ENV)
    assert results[0] == results[1]  # reduced gradients are bitwise identical on every rank
