"""Data-parallel TensorFlow 2 training with hvdlite: a custom loop with DistributedGradientTape.

    hvdliterun -np 2 python examples/tensorflow2_digits.py [--epochs 8]
    python examples/tensorflow2_digits.py          # also runs as a 1-process job

A Horovod TensorFlow 2 script with one import changed (import hvdlite.tensorflow as hvd). The
training step is a tf.function: the gradient tape is wrapped in hvd.DistributedGradientTape,
which averages the gradients across ranks; after the first step (once the optimizer has
created its variables) the model and optimizer variables are broadcast from rank 0. Each rank
trains on its shard of scikit-learn's digits; rank 0 prints per-epoch averages and the final
test accuracy.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from tensorflow2_keras_digits import build_model, load_split, setup

import hvdlite.tensorflow as hvd


def main():
    args = setup(__doc__)
    rank, size = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = load_split()
    x_train, y_train = x_train[rank::size], y_train[rank::size]

    model = build_model()
    opt = keras.optimizers.SGD(learning_rate=args.lr * size, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:  # a Python bool: traced once with the broadcast, once without
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss, tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y, tf.float32))

    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(len(x_train))
        total_loss, correct = 0.0, 0.0
        for start in range(0, len(order), args.batch_size):
            idx = order[start : start + args.batch_size]
            loss, hits = train_step(x_train[idx], y_train[idx], epoch == 0 and start == 0)
            total_loss += float(loss) * len(idx)
            correct += float(hits)
        stats = hvd.allreduce(
            tf.constant([total_loss / len(order), correct / len(order)]), name="epoch.stats"
        )
        if rank == 0:
            print("epoch %2d  loss %.4f  train accuracy %.4f" % (epoch + 1, stats[0], stats[1]))

    logits = model(x_test[rank::size], training=False)
    correct = int(tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y_test[rank::size], tf.int64)))
    counts = hvd.allreduce(
        tf.constant([correct, len(y_test[rank::size])], tf.int64), op=hvd.Sum, name="test.counts"
    )
    if rank == 0:
        print("test accuracy %.4f on %d ranks" % (counts[0] / counts[1], size))


if __name__ == "__main__":
    main()
