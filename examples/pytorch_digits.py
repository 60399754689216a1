"""Data-parallel PyTorch training with hvdlite: a small CNN on the digits data set.

    hvdliterun -np 2 python examples/pytorch_digits.py [--epochs 8]
    python examples/pytorch_digits.py            # also runs as a 1-process job

The script is a Horovod script with one import changed (import hvdlite.torch as hvd).
scikit-learn's bundled digits (8x8 images, 1797 samples, no download) are split 80/20 with a
fixed seed. Every rank trains on its shard of the training set (rows rank::size) with the
learning rate scaled by the number of ranks; rank 0's parameters and optimizer state are
broadcast to all, hvd.DistributedOptimizer averages gradients as backward produces them,
and the per-epoch loss and accuracy are averaged across ranks. Rank 0 shows a progress bar
and prints the final test accuracy, computed over every rank's share of the test set.
"""

import argparse

import torch
import torch.nn.functional as F
from digits_cnn import SmallCNN
from sklearn.datasets import load_digits
from tqdm import tqdm

import hvdlite.torch as hvd


def load_split(seed=0):
    """(x_train, y_train, x_test, y_test) as tensors; pixels in [0, 1]; the same split everywhere."""
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_train = int(0.8 * len(x))
    return x[order[:n_train]], y[order[:n_train]], x[order[n_train:]], y[order[n_train:]]


def metric_average(value, name):
    """The mean of a Python number over every rank."""
    return hvd.allreduce(torch.tensor(float(value)), name=name).item()


def train_epoch(model, opt, x, y, batch_size, epoch, show_progress):
    model.train()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
    batches = range(0, len(x), batch_size)
    bar = tqdm(batches, desc="epoch %d" % epoch, disable=not show_progress, mininterval=0.5)
    total_loss, correct = 0.0, 0
    for start in bar:
        idx = order[start : start + batch_size]
        opt.zero_grad()
        logits = model(x[idx])
        loss = F.cross_entropy(logits, y[idx])
        loss.backward()
        opt.step()
        total_loss += loss.item() * len(idx)
        correct += int((logits.argmax(1) == y[idx]).sum())
        # refresh=False: tqdm draws at its own pace; a refresh here would redraw a stale count
        bar.set_postfix(loss="%.3f" % loss.item(), refresh=False)
    return total_loss / len(x), correct / len(x)


def test_accuracy(model, x, y):
    """Accuracy over the whole test set: each rank scores its share, counts are summed."""
    model.eval()
    with torch.no_grad():
        correct = int((model(x).argmax(1) == y).sum())
    counts = hvd.allreduce(torch.tensor([correct, len(x)], dtype=torch.int64), op=hvd.Sum, name="test.counts")
    return counts[0].item() / counts[1].item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the number of ranks")
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # different on purpose: the broadcast makes them equal
    rank, size = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = load_split()
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]

    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    for epoch in range(1, args.epochs + 1):
        loss, acc = train_epoch(model, opt, x_shard, y_shard, args.batch_size, epoch, rank == 0)
        loss, acc = metric_average(loss, "epoch.loss"), metric_average(acc, "epoch.acc")
        if rank == 0:
            print("epoch %2d  loss %.4f  train accuracy %.3f" % (epoch, loss, acc), flush=True)
    accuracy = test_accuracy(model, x_test[rank::size], y_test[rank::size])
    if rank == 0:
        print("test accuracy %.3f on %d ranks" % (accuracy, size), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
