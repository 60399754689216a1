"""Data-parallel training in plain NumPy with hvdlite: a 64-64-10 MLP on the digits data set.

    hvdliterun -np 2 python examples/numpy_digits.py [--epochs 20]
    python examples/numpy_digits.py            # also runs as a 1-process job

scikit-learn's bundled digits (8x8 images, 1797 samples, no download) are split 80/20 with a
fixed seed. Every rank trains on its shard of the training set (rows rank::size); rank 0's
initial parameters are broadcast to all, gradients and the loss are averaged with
hvd.allreduce, so every rank holds the same parameters after every step. Rank 0 prints the
loss per epoch and the final test accuracy.
"""

import argparse

import numpy as np
from sklearn.datasets import load_digits

import hvdlite as hvd

HIDDEN = 64
CLASSES = 10


def load_split(seed=0):
    """(x_train, y_train, x_test, y_test): pixels scaled to [0, 1], the same split on every rank."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_train = int(0.8 * len(x))
    train, test = order[:n_train], order[n_train:]
    return x[train], y[train], x[test], y[test]


def init_params(rng):
    def dense(n_in, n_out):
        return rng.normal(0.0, np.sqrt(2.0 / n_in), (n_in, n_out)).astype(np.float32)

    return {
        "w1": dense(64, HIDDEN),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": dense(HIDDEN, CLASSES),
        "b2": np.zeros(CLASSES, np.float32),
    }


def forward(params, x):
    h = np.maximum(x @ params["w1"] + params["b1"], 0.0)
    logits = h @ params["w2"] + params["b2"]
    return h, logits


def loss_and_grads(params, x, y):
    """Mean softmax cross-entropy over the batch and its gradient for every parameter."""
    h, logits = forward(params, x)
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    n = len(x)
    loss = -np.log(probs[np.arange(n), y] + 1e-12).mean()
    d_logits = probs
    d_logits[np.arange(n), y] -= 1.0
    d_logits /= n
    d_h = (d_logits @ params["w2"].T) * (h > 0)
    grads = {"w2": h.T @ d_logits, "b2": d_logits.sum(axis=0), "w1": x.T @ d_h, "b1": d_h.sum(axis=0)}
    return float(loss), grads


def accuracy(params, x, y):
    return float((forward(params, x)[1].argmax(axis=1) == y).mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = load_split()
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]

    # Different seeds per rank on purpose: the broadcast makes every rank start from rank 0's.
    params = init_params(np.random.default_rng(1234 + rank))
    for key in sorted(params):
        hvd.broadcast_(params[key], root_rank=0, name="param." + key)
    velocity = {k: np.zeros_like(v) for k, v in params.items()}

    # Shards differ in size by at most one row: every rank runs the same number of steps,
    # so every allreduce is matched on all ranks.
    steps = -(-(len(x_train) // size) // args.batch_size)
    shuffle = np.random.default_rng(100 + rank)
    for epoch in range(1, args.epochs + 1):
        order = shuffle.permutation(len(x_shard))
        total = 0.0
        for step in range(steps):
            idx = order[step * args.batch_size : (step + 1) * args.batch_size]
            loss, grads = loss_and_grads(params, x_shard[idx], y_shard[idx])
            total += loss
            for key in sorted(grads):
                g = hvd.allreduce(grads[key].astype(np.float32), op=hvd.Average, name="grad." + key)
                velocity[key] = args.momentum * velocity[key] - args.lr * g
                params[key] += velocity[key]
        mean_loss = hvd.allreduce(np.array([total / steps]), op=hvd.Average, name="loss")[0]
        if rank == 0:
            print("epoch %d: loss %.4f" % (epoch, mean_loss), flush=True)

    acc = accuracy(params, x_test, y_test)
    if rank == 0:
        print("test accuracy: %.4f (%d ranks, %d epochs)" % (acc, size, args.epochs), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
