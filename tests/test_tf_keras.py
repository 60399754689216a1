"""hvdlite.tensorflow.keras on 2 real processes: model.fit with the
DistributedOptimizer and every callback, load_model, and the learning-rate
schedules (one job runs every check)."""

import numpy as np
from helpers import run_ranks

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
    import keras
    import tensorflow as tf

    import hvdlite.tensorflow.keras as hvd

    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    out = _fit_checks(hvd, keras, tmp)
    _schedule_checks(hvd, keras)
    hvd.shutdown()
    return out


def test_fit_with_callbacks_and_load_model(tmp_path):
    results = run_ranks(_job, 2, args=(str(tmp_path),), timeout=240, env=TF_ENV)
    assert results[0]["weights"] == results[1]["weights"]  # broadcast + averaged gradients keep ranks equal
    assert results[0]["loaded"] == results[1]["loaded"]
    assert results[0]["loss"] == results[1]["loss"]  # MetricAverageCallback: the same averaged loss
    lr = results[0]["lr"]
    # warmup from 0.1 / size over 2 epochs (set per batch; left at its last value afterwards, as Horovod's)
    assert 0.05 < lr[0] < lr[1] <= 0.1 and lr[2] == lr[1]
