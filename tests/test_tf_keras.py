"""hvdlite.tensorflow.keras on 2 real processes: model.fit with the
DistributedOptimizer and every callback, load_model, and the learning-rate
schedules (one job runs every check), under each Keras tf.keras can be
(Keras 3, and Keras 2 = tf_keras with TF_USE_LEGACY_KERAS=1: the keras_env
fixture); then the Keras-2-only paths and the errors for a wrong combination."""

import os
import subprocess
import sys

import numpy as np
from helpers import TF_SPAWN_ENV, run_pooled

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def _model(keras, seed):
    keras.utils.set_random_seed(seed)  # different initial weights per rank: the broadcast must fix them
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )


def _fit_checks(hvd, keras, tmp):
    r, _n = hvd.rank(), hvd.size()
    model = _model(keras, seed=r)
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)), loss="mse"
    )
    rng = np.random.default_rng(r)  # each rank its own shard of data
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2, verbose=0),
    ]
    history = model.fit(x, y, batch_size=16, epochs=3, callbacks=callbacks, verbose=0)
    weights = b"".join(w.tobytes() for w in model.get_weights())
    path = "%s/model.%d.keras" % (tmp, r)
    model.save(path)
    loaded = hvd.load_model(path)
    assert getattr(loaded.optimizer, "_hvdlite_distributed", False)
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[hvd.callbacks.MetricAverageCallback()])
    return {
        "weights": weights,
        "loss": history.history["loss"],
        "lr": history.history["lr"],
        "loaded": b"".join(w.tobytes() for w in loaded.get_weights()),
    }


class _FakeModel:
    """Only what the schedule callbacks touch: model.optimizer."""

    def __init__(self, keras):
        self.optimizer = keras.optimizers.SGD(learning_rate=1.0)


def _schedule_checks(hvd, keras):
    model = _FakeModel(keras)
    cb = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=1.0, multiplier=lambda e: 0.5**e, start_epoch=1, end_epoch=3, staircase=True
    )
    cb.set_model(model)
    cb.on_train_begin()
    seen = []
    for epoch in range(4):
        cb.on_epoch_begin(epoch)
        cb.on_batch_begin(0)
        seen.append(float(model.optimizer.learning_rate.numpy()))
    assert seen == [1.0, 0.5, 0.25, 0.25], seen
    smooth = hvd.callbacks.LearningRateScheduleCallback(1.0, lambda e: e, staircase=False, steps_per_epoch=4)
    smooth.set_model(model)
    smooth.on_train_begin()
    smooth.on_epoch_begin(1)
    smooth.on_batch_begin(2)
    assert float(model.optimizer.learning_rate.numpy()) == 1.5


def _job(tmp):
    import tensorflow as tf
    from tensorflow import keras

    import hvdlite.tensorflow.keras as hvd

    tf.get_logger().setLevel("ERROR")
    hvd.init()
    out = _fit_checks(hvd, keras, tmp)
    _schedule_checks(hvd, keras)
    hvd.shutdown()
    return out


def test_fit_with_callbacks_and_load_model(tmp_path, keras_env):
    results = run_pooled(
        _job, 2, args=(str(tmp_path),), timeout=240, env=TF_ENV, spawn_env=dict(TF_SPAWN_ENV, **keras_env)
    )
    assert results[0]["weights"] == results[1]["weights"]  # broadcast + averaged gradients keep ranks equal
    assert results[0]["loaded"] == results[1]["loaded"]
    assert results[0]["loss"] == results[1]["loss"]  # MetricAverageCallback: the same averaged loss
    lr = results[0]["lr"]
    # warmup from 0.1 / size over 2 epochs (set per batch; left at its last value afterwards, as Horovod's)
    assert 0.05 < lr[0] < lr[1] <= 0.1 and lr[2] == lr[1]


def _keras2_job(tmp):
    """Keras 2 only: a legacy OptimizerV2 made with lr=, its get_gradients / _compute_gradients
    (reduced), backward_passes_per_step, and an .h5 model with a custom optimizer class."""
    import tensorflow as tf
    from tensorflow import keras

    import hvdlite.tensorflow.keras as hvd

    tf.get_logger().setLevel("ERROR")
    hvd.init()
    r = hvd.rank()
    out = {}
    v = tf.Variable([1.0])
    opt = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr=0.5))
    grads = tf.function(lambda: opt.get_gradients(v * (r + 1.0), [v]))()
    out["get_gradients"] = [g.numpy().tolist() for g in grads]  # (1 + 2) / 2 on every rank
    pairs = opt._compute_gradients(lambda: v * (r + 1.0), var_list=[v])
    out["compute"] = pairs[0][0].numpy().tolist()
    opt.apply_gradients(pairs)  # applied as computed (already reduced): 1 - 0.5 * 1.5
    out["applied"] = v.numpy().tolist()

    class MySGD(keras.optimizers.legacy.SGD):
        pass

    keras.utils.set_random_seed(r)
    model = keras.Sequential([keras.layers.Dense(4, input_shape=(3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(MySGD(lr=0.1), backward_passes_per_step=2), loss="mse")
    x = tf.random.stateless_normal((16, 3), seed=(r, 0))
    model.fit(
        x,
        tf.reduce_sum(x, 1),
        batch_size=4,
        epochs=2,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    out["passes"] = [
        int(model.optimizer.iterations.numpy()),
        int(model.optimizer._agg_helper.counter.numpy()),
    ]
    path = "%s/model.%d.h5" % (tmp, r)
    model.save(path)
    loaded = hvd.load_model(path, custom_optimizers=[MySGD])
    out["loaded"] = [
        type(loaded.optimizer).__name__,
        isinstance(loaded.optimizer, MySGD),
        getattr(loaded.optimizer, "_hvdlite_distributed", False),
    ]
    loaded.fit(x, tf.reduce_sum(x, 1), batch_size=4, epochs=1, verbose=0)
    out["weights"] = [w.tolist() for w in loaded.get_weights()]
    hvd.shutdown()
    return out


def test_keras2_legacy_optimizer_gradients_and_h5(tmp_path, keras2_env):
    """Keras 2 only (Keras 3 has no legacy optimizers, lr= or get_gradients)."""
    results = run_pooled(
        _keras2_job,
        2,
        args=(str(tmp_path),),
        timeout=240,
        env=TF_ENV,
        spawn_env=dict(TF_SPAWN_ENV, **keras2_env),
    )
    for got in results:
        assert got["get_gradients"] == [[1.5]] and got["compute"] == [1.5]
        assert got["applied"] == [0.25]
        assert got["passes"] == [8, 0]  # 4 batches x 2 epochs, one update every 2 passes
        assert got["loaded"] == ["MySGD", True, True]
    assert results[0]["weights"] == results[1]["weights"]


def _wrong_keras_job():
    """Objects of the Keras that tf.keras is not: refused, naming the active Keras and the fix."""
    import importlib

    import tensorflow as tf

    import hvdlite.tensorflow.keras as hvd
    from hvdlite.common.exceptions import HvdliteError

    other = importlib.import_module("keras" if tf.keras.__name__.startswith("tf_keras") else "tf_keras")
    model = other.Sequential([other.layers.Dense(1)])
    errors = []
    for call in (
        lambda: hvd.DistributedOptimizer(other.optimizers.SGD(0.1)),
        lambda: hvd.callbacks.BroadcastGlobalVariablesCallback(0).set_model(model),
    ):
        try:
            call()
            errors.append(None)
        except HvdliteError as e:
            errors.append([type(e).__name__, str(e)])
    return errors


def test_wrong_keras_objects_are_refused_with_the_fix(keras_env):
    keras2 = keras_env["TF_USE_LEGACY_KERAS"] == "1"
    errors = run_pooled(
        _wrong_keras_job, 1, timeout=120, env=TF_ENV, spawn_env=dict(TF_SPAWN_ENV, **keras_env)
    )[0]
    for error in errors:
        assert error is not None and error[0] == "InvalidArgumentError", errors
        active = "Keras 2 (tf_keras" if keras2 else "Keras 3 (keras"
        fix = "unset TF_USE_LEGACY_KERAS" if keras2 else "set TF_USE_LEGACY_KERAS=1"
        assert active in error[1] and fix in error[1], error[1]


def test_legacy_keras_requested_without_tf_keras_says_how_to_fix():
    """TF_USE_LEGACY_KERAS=1 where tf_keras cannot be imported (hidden here by a None entry in
    sys.modules, as if not installed): the error names the variable and the install command."""
    code = (
        "import sys\n"
        "sys.modules['tf_keras'] = None\n"
        "from hvdlite.common.exceptions import PreconditionError\n"
        "try:\n"
        "    import hvdlite.tensorflow.keras\n"
        "except PreconditionError as e:\n"
        "    print('ERROR', e)\n"
    )
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", **TF_ENV)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0 and "ERROR TF_USE_LEGACY_KERAS=1" in res.stdout, res.stdout + res.stderr
    assert "pip install --no-deps tf-keras==" in res.stdout and "unset TF_USE_LEGACY_KERAS" in res.stdout
