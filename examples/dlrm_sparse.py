"""A DLRM-style click model with sharded embedding tables, on synthetic Criteo-shaped data.

    hvdliterun -np 2 python examples/dlrm_sparse.py --steps 300
    hvdliterun -np 2 python examples/dlrm_sparse.py --max-rows 10000000      # tables up to 10^7 rows

13 dense features and 26 categorical ones, one id each, drawn from a power law (a few ids are
most of the traffic, as in Criteo); table sizes spread log-evenly from --min-rows to --max-rows.
The labels come from a hidden logistic model of the dense features and a score per (feature, id),
so there is something to learn and AUC measures it. The model: a bottom MLP for the dense
features, the 26 tables in one hvd.parallel.ShardedEmbeddingCollection (placed by the planner,
row-wise Adagrad updating rows on their owners during backward), DLRM's pairwise dot
interaction and a top MLP. The dense part is data-parallel (DistributedOptimizer). Each rank
trains on its own stream; rank 0 shows a progress bar and prints the AUC on a held-out set
before and after training. `DLRM`, `table_rows` and `make_batch` are also the model and data of
benchmarks/sparse_embeddings.py.
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
from torch import nn

DENSE, SPARSE = 13, 26


def table_rows(min_rows, max_rows, count=SPARSE):
    """Table sizes spread log-evenly over [min_rows, max_rows]."""
    if count == 1:
        return [int(max_rows)]
    ratio = (max_rows / min_rows) ** (1 / (count - 1))
    return [round(min_rows * ratio**i) for i in range(count)]


def _hidden_score(feature, ids):
    """The hidden model's score of an id of a feature, in [-1, 1) (a fixed hash)."""
    return ((ids * 2654435761 + feature * 40503) % 2048).float() / 1024 - 1


def make_batch(gen, rows, batch, alpha=1.2):
    """(dense [batch, 13], {"f<i>": ids [batch, 1]}, labels [batch]) with ids of feature i drawn
    from a power law of exponent `alpha` over rows[i] ids (id 0 the most frequent)."""
    dense = torch.randn(batch, DENSE, generator=gen)
    ids, score = {}, dense[:, :4].sum(1) * 0.5
    for i, n in enumerate(rows):
        u = torch.rand(batch, generator=gen)
        x = (n ** (1 - alpha) - 1) * u + 1  # inverse CDF of a continuous power law on [1, n]
        f = (x ** (1 / (1 - alpha)) - 1).long().clamp_(0, n - 1)
        ids["f%d" % i] = f.unsqueeze(1)
        score = score + _hidden_score(i, f) * 0.6
    labels = (torch.rand(batch, generator=gen) < torch.sigmoid(score - 0.5)).float()
    return dense, ids, labels


def _mlp(sizes):
    layers = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    """Bottom MLP, `embeddings` (a module mapping {name: ids} to {name: [batch, dim]}: sharded
    or not), pairwise dot interaction, top MLP; returns logits [batch]."""

    def __init__(self, embeddings, dim):
        super().__init__()
        self.embeddings = embeddings
        self.bottom = _mlp([DENSE, 64, dim])
        pairs = (SPARSE + 1) * SPARSE // 2
        self.top = _mlp([dim + pairs, 64, 1])

    def forward(self, dense, ids):
        x = self.bottom(dense)
        pooled = self.embeddings(ids)
        z = torch.stack([x] + [pooled[k] for k in sorted(pooled, key=lambda k: int(k[1:]))], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))
        i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


def auc(scores, labels):
    """Area under the ROC curve (the rank statistic; ties get their mean rank)."""
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    for value in torch.unique(scores[order]):  # mean rank of ties (rare with float scores)
        tied = scores == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    pos = labels.sum()
    return float((ranks[labels > 0].sum() - pos * (pos + 1) / 2) / (pos * (len(labels) - pos)))


def sharded_tables(hvd, rows, dim, lr):
    specs = {"f%d" % i: (n, dim, "sum") for i, n in enumerate(rows)}
    return hvd.parallel.ShardedEmbeddingCollection(
        specs, sharding="auto", optimizer="adagrad", lr=lr, name="dlrm"
    )


def _evaluate(hvd, model, held_out):
    dense, ids, labels = held_out
    with torch.no_grad():
        scores = model(dense, ids)
    everyone = hvd.allgather(torch.stack([scores, labels], 1), name="dlrm.eval")
    return auc(everyone[:, 0], everyone[:, 1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=512, help="examples per rank per step")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--min-rows", type=int, default=10_000)
    parser.add_argument("--max-rows", type=int, default=1_000_000)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    import hvdlite.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    rows = table_rows(args.min_rows, args.max_rows)
    torch.manual_seed(0)  # the same dense initial weights on every rank
    model = DLRM(sharded_tables(hvd, rows, args.dim, args.lr), args.dim)
    dense_params = [(n, p) for n, p in model.named_parameters()]  # the tables are not parameters
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam([p for _, p in dense_params], lr=1e-3), named_parameters=dense_params
    )
    held_out = make_batch(torch.Generator().manual_seed(10_000 + hvd.rank()), rows, 2048)
    gen = torch.Generator().manual_seed(hvd.rank())
    if hvd.rank() == 0:
        layouts = model.embeddings.layouts.values()
        print(
            "%d ranks, 26 tables of %d to %d rows x %d (%s), AUC before training %.4f"
            % (
                hvd.size(),
                rows[0],
                rows[-1],
                args.dim,
                ", ".join(
                    "%d %s" % (sum(v.sharding == s for v in layouts), s) for s in ("table", "row", "column")
                ),
                _evaluate(hvd, model, held_out),
            ),
            flush=True,
        )
    else:
        _evaluate(hvd, model, held_out)
    steps = range(args.steps)
    if hvd.rank() == 0:
        from tqdm import tqdm

        steps = tqdm(steps, desc="train", mininterval=1.0)
    for step in steps:
        dense, ids, labels = make_batch(gen, rows, args.batch)
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
        loss.backward()  # the tables' rows are updated here, on their owners
        opt.step()
        if hvd.rank() == 0 and step % 20 == 0:
            steps.set_postfix(loss="%.4f" % loss.item())
    final = _evaluate(hvd, model, held_out)
    if hvd.rank() == 0:
        sent = model.embeddings.traffic()
        print(
            "AUC after %d steps: %.4f; rank 0 sent %.1f KB of ids and %.1f KB of rows and gradients per step"
            % (
                args.steps,
                final,
                sent["id_bytes"] / 1e3 / sent["steps"],
                sent["row_bytes"] / 1e3 / sent["steps"],
            )
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
