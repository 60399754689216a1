"""Worker-local variables and scale_local_gradients (Horovod 0.28 semantics) on 2 ranks:
a variable registered with register_local_var (optimizers) / register_local_source (tapes),
or a local layer of PartialDistributedGradientTape, keeps its own gradient, divided by the
process set's size when scale_local_gradients=True and left as it is when False."""

from helpers import TF_SPAWN_ENV, run_pooled

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def _tape_grads(hvd, tf, scale, partial):
    r = hvd.rank()
    shared, local = tf.Variable([1.0]), tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared * (r + 1.0)) + tf.reduce_sum(local * (r + 1.0))
    if partial:
        layer = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
        layer.build((None, 1))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(shared * (r + 1.0)) + tf.reduce_sum(layer(tf.ones([1, 1]))) * (r + 1.0)
        tape = hvd.PartialDistributedGradientTape(tape, local_layers=[layer], scale_local_gradients=scale)
        local = layer.trainable_weights[0]
    else:
        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
        tape.register_local_source(local)
    return [float(tf.reshape(g, [-1])[0]) for g in tape.gradient(loss, [shared, local])]


def _split_grads(hvd, tf, scale):
    """get_local_and_global_gradients: (source, grad) pairs split by locality, in source order."""
    r = hvd.rank()
    shared, local = tf.Variable([1.0]), tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared * (r + 1.0)) + tf.reduce_sum(local * (r + 1.0))
    tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
    tape.register_local_source(local)
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, [shared, local])
    assert [v is shared for v, _ in global_pairs] == [True] and [v is local for v, _ in local_pairs] == [True]
    return [float(global_pairs[0][1][0]), float(local_pairs[0][1][0])]


def _v1_grads(hvd, tf, scale):
    r = hvd.rank()
    shared, local = tf.Variable([0.0]), tf.Variable([0.0])
    opt = hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1.0), scale_local_gradients=scale
    )
    opt.register_local_var(local)
    pairs = opt.compute_gradients(lambda: (shared + local) * (r + 1.0), var_list=[shared, local])
    return [float(g.numpy()[0]) for g, _ in pairs]


def _keras_update(hvd, tf, scale):
    r = hvd.rank()
    shared, local = tf.Variable([0.0]), tf.Variable([0.0])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=1.0), scale_local_gradients=scale)
    opt.register_local_var(local)
    opt.apply_gradients([(tf.constant([r + 1.0]), shared), (tf.constant([r + 1.0]), local)])
    return [-float(shared.numpy()[0]), -float(local.numpy()[0])]


def _job():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    hvd.init()
    out = {}
    for scale in (True, False):
        out["tape", scale] = _tape_grads(hvd, tf, scale, partial=False)
        out["partial", scale] = _tape_grads(hvd, tf, scale, partial=True)
        out["split", scale] = _split_grads(hvd, tf, scale)
        out["v1", scale] = _v1_grads(hvd, tf, scale)
        out["keras", scale] = _keras_update(hvd, tf, scale)
    hvd.shutdown()
    return out


def test_local_gradients_are_kept_and_scaled_as_asked():
    for r, out in enumerate(run_pooled(_job, 2, timeout=240, env=TF_ENV, spawn_env=TF_SPAWN_ENV)):
        for kind in ("tape", "partial", "split", "v1", "keras"):
            # shared: the average of 1 and 2; local: this rank's own r+1, halved when scaling
            assert out[kind, True] == [1.5, (r + 1.0) / 2], (kind, out)
            assert out[kind, False] == [1.5, r + 1.0], (kind, out)
