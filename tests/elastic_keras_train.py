"""An elastic Keras fit (KerasState and the elastic callbacks) run by tests/test_elastic.py under
`hvdliterun --min-np ...`. ELASTIC_KILL="worker_id:epoch:batch": that worker SIGKILLs itself
when that batch begins. Every rank prints "DONE <epoch> <json weights>" at the end."""

import json
import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from tensorflow import keras

import hvdlite.tensorflow.keras as hvd

EPOCHS = 3
ME = os.environ.get("HVDLITE_ELASTIC_WORKER_ID", "")
KILL = os.environ.get("ELASTIC_KILL", "")


class Killer(keras.callbacks.Callback):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_begin(self, batch, logs=None):
        wid, epoch, at = KILL.rsplit(":", 2) if KILL else ("", -1, -1)
        if wid == ME and self.state.epoch == int(epoch) and batch == int(at):
            os.kill(os.getpid(), signal.SIGKILL)


tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
rng = np.random.default_rng(3)
x = rng.standard_normal((32, 3)).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5]], "float32")).astype("float32")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
state = hvd.elastic.KerasState(model, batch=0, epoch=0)


@hvd.elastic.run
def train(state):
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=EPOCHS - state.epoch,
        verbose=0,
        callbacks=[
            Killer(state),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            hvd.elastic.CommitStateCallback(state, batches_per_commit=1),
        ],
    )


train(state)
weights = [w.tolist() for w in model.get_weights()]
print("DONE %d %d %s" % (state.epoch, hvd.size(), json.dumps(weights)), flush=True)
hvd.shutdown()
