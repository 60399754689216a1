"""One rank of e2e_tf.py: training steps of the 25M-parameter mlp in TensorFlow, timed.

    python _e2e_tf_worker.py --lib hvdlite --out DIR --mode alone|train|fp16 --model mlp --steps S --idle-wait W

MODE: alone (a plain tf.GradientTape, no communication), train (hvdlite.tensorflow's
DistributedGradientTape), fp16 (the same with Compression.fp16). One TensorFlow thread per
rank; the step is a tf.function. Same warmup, idle gate, barriers and output document
(DIR/rank<r>.json) as _e2e_torch_worker.py (the loop is _machine.timed_steps).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _machine import timed_steps  # noqa: E402
from _worker import add_step_args, finish, join, parse_args, step_doc  # noqa: E402

BATCH = 32
WARMUP = 3


def make_step(mode):
    """(step callable, parameter count) for the mlp, batch BATCH."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(4096, activation="relu"),
            keras.layers.Dense(4096, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    opt = keras.optimizers.SGD(learning_rate=0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = tf.random.normal([BATCH, 64])
    y = tf.random.uniform([BATCH], 0, 10, dtype=tf.int64)
    hvd = None
    if mode != "alone":
        import hvdlite.tensorflow as hvd

        hvd.broadcast_variables(model.variables, root_rank=0)
    compression = hvd.Compression.fp16 if mode == "fp16" else (hvd.Compression.none if hvd else None)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if hvd is not None:
            tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return (lambda: step().numpy()), model.count_params()


def main():
    args = parse_args(add_step_args)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    comm, gate = join(args)
    step, params = make_step(args.mode)
    times, load = timed_steps(comm, gate, step, args.steps, args.idle_wait, warmup=WARMUP)
    comm.version += ", tensorflow " + tf.__version__
    finish(comm, args, step_doc(comm, times, load, params=params))


if __name__ == "__main__":
    sys.exit(main())
