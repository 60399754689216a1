"""TensorFlow's stateful compressors (Compression.topk, .sign) in DistributedGradientTape on
2 real processes, eagerly and inside tf.function (one job: TensorFlow's import dominates):
training reaches a loss close to uncompressed training, replicas stay bitwise identical,
error feedback keeps exactly what was not sent, and tf.train.Checkpoint carries the
residuals."""

import numpy as np
import pytest
from helpers import TF_SPAWN_ENV, run_pooled

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def _problem(tf):
    g = np.random.default_rng(0)
    x = g.standard_normal((128, 16)).astype(np.float32)
    y = np.tanh(x @ g.standard_normal((16, 4))).astype(np.float32)
    w1 = g.standard_normal((16, 64)).astype(np.float32) * 0.25
    w2 = g.standard_normal((64, 4)).astype(np.float32) * 0.125
    return tf.constant(x), tf.constant(y), w1, w2


def _train(hvd, tf, make, graph, steps=60):
    x, y, w1_init, w2_init = _problem(tf)
    shard = slice(hvd.rank(), None, hvd.size())
    xs, ys = x[shard], y[shard]
    w1, w2, b = tf.Variable(w1_init), tf.Variable(w2_init), tf.Variable(tf.zeros([64]))
    variables = [w1, b, w2]
    compression = make()
    opt = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.tanh(xs @ w1 + b) @ w2 - ys) ** 2)
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    run = tf.function(step) if graph else step
    for _ in range(steps):
        run()
    loss = float(tf.reduce_mean((tf.tanh(x @ w1 + b) @ w2 - y) ** 2))
    return loss, [v.numpy() for v in variables], compression


def _feedback(hvd, tf, make):
    """One step from zero residuals: (gathered [grad, residual] per variable, outputs)."""
    x, y, w1_init, w2_init = _problem(tf)
    shard = slice(hvd.rank(), None, hvd.size())
    w1, w2 = tf.Variable(w1_init), tf.Variable(w2_init)
    compression = make()
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean((tf.tanh(x[shard] @ w1) @ w2 - y[shard]) ** 2)
    local = tape.gradient(loss, [w1, w2])
    reduced = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, [w1, w2])
    names = sorted(compression.residuals)
    out = []
    for g, name, r in zip(local, names, reduced):
        stacked = tf.stack([g, compression.residuals[name].read_value()])
        out.append((hvd.allgather(stacked[None]).numpy(), r.numpy()))
    checkpoint = tf.train.Checkpoint(compression=compression)
    path = checkpoint.write("/tmp/hvdlite_tf_compression_%d_%s" % (hvd.rank(), compression.method))
    saved = [compression.residuals[n].numpy() for n in names]
    for n in names:
        compression.residuals[n].assign(tf.zeros_like(compression.residuals[n]))
    checkpoint.read(path).assert_consumed()
    restored = all(np.array_equal(s, compression.residuals[n].numpy()) for s, n in zip(saved, names))
    return out, restored


def _job():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    tf.get_logger().setLevel("ERROR")
    hvd.init()
    makers = {
        "none": lambda: hvd.Compression.none,
        "topk": lambda: hvd.Compression.topk(ratio=0.1, min_numel=256),
        "sign": lambda: hvd.Compression.sign(min_numel=256),
        "powersgd": lambda: hvd.Compression.powersgd(rank=2, start_step=3, min_numel=256),
        "powersgd0": lambda: hvd.Compression.powersgd(rank=2, start_step=0, min_numel=256),
    }
    x, y, w1, w2 = _problem(tf)
    out = {"train": {}, "feedback": {}, "initial": float(tf.reduce_mean((tf.tanh(x @ w1) @ w2 - y) ** 2))}
    for kind, make in makers.items():
        if kind == "powersgd0":
            continue
        for graph in (False, True):
            loss, params, _ = _train(hvd, tf, make, graph)
            out["train"][(kind, graph)] = (loss, params)
    for kind in ("topk", "sign", "powersgd0"):
        out["feedback"][kind] = _feedback(hvd, tf, makers[kind])
    try:
        hvd.allreduce(tf.ones([3]), compression=hvd.Compression.topk())
        out["misuse"] = None
    except Exception as e:
        out["misuse"] = (type(e).__name__, str(e))
    hvd.shutdown()
    return out


@pytest.mark.slow  # ~17 s of tf.function tracing: CI runs it, `make test` keeps its 5-minute budget
def test_tf_compressors_train_exactly_and_keep_their_residuals():
    results = run_pooled(_job, 2, timeout=240, env=TF_ENV, spawn_env=TF_SPAWN_ENV)
    mine, theirs = results
    for graph in (False, True):
        baseline = mine["train"][("none", graph)][0]
        for kind in ("none", "topk", "sign", "powersgd"):
            loss, params = mine["train"][(kind, graph)]
            assert loss == theirs["train"][(kind, graph)][0]
            for a, b in zip(params, theirs["train"][(kind, graph)][1]):
                assert np.array_equal(a, b), (kind, graph)  # replicas identical
            # Top-k at 10% with error feedback under SGD momentum converges slowly on this problem
            # (torch's compressor reaches the same loss on it); the scaled sign keeps up.
            bound = {"none": 1.0, "sign": 1.6, "powersgd": 1.6, "topk": 8.0}[kind] * baseline
            assert loss <= bound and loss < 0.5 * mine["initial"], (kind, graph, loss, baseline)
    for kind in ("topk", "sign", "powersgd0"):
        pairs, restored = mine["feedback"][kind]
        assert restored and theirs["feedback"][kind][1]
        for gathered, output in pairs:
            grad_sum, residual_sum = gathered[0][0] + gathered[1][0], gathered[0][1] + gathered[1][1]
            np.testing.assert_allclose(residual_sum + 2 * output, grad_sum, rtol=1e-5, atol=1e-6)
            if kind == "topk":
                for g, r in ((gathered[0][0], gathered[0][1]), (gathered[1][0], gathered[1][1])):
                    kept = r != 0
                    assert np.array_equal(r[kept], g[kept]) and (~kept).sum() == int(g.size * 0.1)
    assert mine["misuse"][0] == "NotSupportedError" and "DistributedGradientTape" in mine["misuse"][1]
