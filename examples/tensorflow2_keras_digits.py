"""Data-parallel Keras training with hvdlite: model.fit on the digits data set (Keras 3, or
Keras 2 with TF_USE_LEGACY_KERAS=1: tf.keras is either).

    hvdliterun -np 2 python examples/tensorflow2_keras_digits.py [--epochs 8]
    python examples/tensorflow2_keras_digits.py          # also runs as a 1-process job

A Horovod Keras script with one import changed (import hvdlite.tensorflow.keras as hvd).
scikit-learn's bundled digits (8x8 images, no download) are split 80/20 with a fixed seed;
each rank fits on its shard (rows rank::size) with the learning rate scaled by the number of
ranks and warmed up over the first epochs. BroadcastGlobalVariablesCallback makes every rank
start from rank 0's weights, the DistributedOptimizer averages gradients, and
MetricAverageCallback averages the epoch's metrics. Rank 0 prints the final test accuracy
(every rank scores its share of the test set; the counts are summed).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from tensorflow import keras

import hvdlite.tensorflow.keras as hvd


def load_split(seed=0):
    """(x_train, y_train, x_test, y_test) as NumPy arrays; the same split on every rank."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_train = int(0.8 * len(x))
    return x[order[:n_train]], y[order[:n_train]], x[order[n_train:]], y[order[n_train:]]


def build_model():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def setup(doc):
    """Parses --epochs/--batch-size/--lr, joins the job, one TensorFlow thread, a per-rank seed
    (different on purpose: rank 0's weights are broadcast). Returns the arguments."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the number of ranks")
    args = parser.parse_args()
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(hvd.rank())
    return args


def main():
    args = setup(__doc__)
    rank, size = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = load_split()

    model = build_model()
    scaled_lr = args.lr * size
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=scaled_lr, momentum=0.9))
    model.compile(
        optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=2, verbose=int(rank == 0)
        ),
    ]
    model.fit(
        x_train[rank::size],
        y_train[rank::size],
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=2 if rank == 0 else 0,
    )

    logits = model.predict(x_test[rank::size], verbose=0)
    correct = int((logits.argmax(1) == y_test[rank::size]).sum())
    counts = hvd.allreduce(
        tf.constant([correct, len(y_test[rank::size])], tf.int64), op=hvd.Sum, name="test.counts"
    )
    if rank == 0:
        print("test accuracy %.4f on %d ranks" % (counts[0] / counts[1], size))


if __name__ == "__main__":
    main()
