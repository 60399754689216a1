"""One rank of sparse_embeddings.py: SGD training steps of examples/dlrm_sparse.py's DLRM
(26 tables, power-law ids, one id per feature), timed, with the bytes this rank sends per step.

    python _sparse_worker.py --lib hvdlite --out DIR --mode MODE --steps S --idle-wait W
        [--batch B --dim D --min-rows R --max-rows R]

MODE: sharded (hvd.parallel.ShardedEmbeddingCollection, planner, fused SGD), sharded-row (every
table row-sharded), allgather (Horovod 0.28.1's sparse path, as its torch DistributedOptimizer
runs it: every rank holds every table as nn.EmbeddingBag(sparse=True); when backward has made a
table's sparse gradient, a hook starts two allgathers of it as it is, not coalesced (indices,
values: one row per id looked up, horovod/torch/mpi_ops.py sparse_allreduce_async); step()
averages them and SGD applies the gathered sparse gradient), dense (sparse_as_dense=True: every
table allreduced whole each step), ps and ps-replicated (the parameter-server mode: the last
half of the ranks serve every table row-sharded, the first half train; ps-replicated adds
replicate=True, each server's changed rows copied to a buddy server after every step). The
dense part is DistributedOptimizer(SGD) in every mode (over the workers in the ps modes).
Bytes sent per step per rank: sharded modes from the collection's counters (ids, rows and
gradients handed to other ranks; in the ps modes a server's replica bytes besides); allgather (n-1) x ids looked up x (dim x 4 + 8) per table;
dense the ring allreduce's 2 (n-1)/n x table bytes. Writes DIR/rank<r>.json.
"""

import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from _machine import timed_steps  # noqa: E402
from _worker import add_step_args, run, step_doc  # noqa: E402
from dlrm_sparse import DLRM, make_batch, table_rows  # noqa: E402

LR = 0.05


class ReplicatedTables(torch.nn.Module):
    """Every table whole on every rank, as sparse-gradient nn.EmbeddingBag modules."""

    def __init__(self, rows, dim):
        super().__init__()
        self.tables = torch.nn.ModuleDict(
            {"f%d" % i: torch.nn.EmbeddingBag(n, dim, mode="sum", sparse=True) for i, n in enumerate(rows)}
        )

    def forward(self, ids):
        return {k: self.tables[k](v) for k, v in ids.items()}


def _add(p):
    add_step_args(p)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--min-rows", type=int, default=10_000)
    p.add_argument("--max-rows", type=int, default=100_000)


class HorovodSparseGradients:
    """Horovod 0.28.1's torch DistributedOptimizer on the sparse gradients of `tables` (its
    algorithm, on hvdlite's collectives): a hook per table starts the allgathers of the gradient's
    indices and values as backward makes it (uncoalesced: Horovod's torch sends them as they
    are); synchronize() waits, averages over the ranks and sets the gathered sparse gradient."""

    def __init__(self, hvd, tables):
        self.hvd, self.handles = hvd, {}
        for name, table in tables.items():
            table.weight.register_post_accumulate_grad_hook(self._hook(name))

    def _hook(self, name):
        def start(weight):
            grad = weight.grad
            self.handles[weight] = (
                self.hvd.allgather_async(
                    grad._indices().transpose(0, 1).contiguous(), name=name + ".indices"
                ),
                self.hvd.allgather_async(grad._values(), name=name + ".values"),
            )

        return start

    def synchronize(self):
        size = self.hvd.size()
        for weight, (indices, values) in self.handles.items():
            v, i = self.hvd.synchronize(values) / size, self.hvd.synchronize(indices)
            weight.grad = torch.sparse_coo_tensor(i.transpose(0, 1), v, weight.shape, check_invariants=False)
        self.handles.clear()


class HorovodSparseOptimizer:
    """SGD over the dense part (DistributedOptimizer) and the replicated tables (Horovod's sparse
    allgathers), stepped together, as one Horovod DistributedOptimizer over the whole model."""

    def __init__(self, hvd, model):
        tables = model.embeddings.tables
        table_params = {id(t.weight) for t in tables.values()}
        dense = [(n, p) for n, p in model.named_parameters() if id(p) not in table_params]
        self.dense = hvd.DistributedOptimizer(
            torch.optim.SGD([p for _, p in dense], lr=LR), named_parameters=dense
        )
        self.sparse = HorovodSparseGradients(hvd, tables)
        self.tables = torch.optim.SGD([t.weight for t in tables.values()], lr=LR)

    def zero_grad(self):
        self.dense.zero_grad()
        self.tables.zero_grad()

    def step(self):
        self.sparse.synchronize()
        self.dense.step()
        self.tables.step()


def _ps_model(hvd, mode, rows, dim):
    """(model or None on a server, optimizer or None, the collection) of a ps mode."""
    n = hvd.size()
    servers, workers = list(range(n // 2, n)), list(range(n // 2))
    worker_set = hvd.add_process_set(workers)
    specs = {"f%d" % i: (r, dim, "sum") for i, r in enumerate(rows)}
    tables = hvd.parallel.ShardedEmbeddingCollection(
        specs, sharding="row", optimizer="sgd", lr=LR, servers=servers, replicate=(mode == "ps-replicated")
    )
    if mode == "ps-replicated":
        tables.rejoin(0)  # forms the ring of buddies and seeds the replicas (elastic jobs: each entry)
    if tables.is_server:
        return None, None, tables
    model = DLRM(tables, dim)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR),
        named_parameters=model.named_parameters(),
        process_set=worker_set,
    )
    return model, opt, tables


def _model(hvd, mode, rows, dim):
    torch.manual_seed(0)
    if mode.startswith("ps"):
        return _ps_model(hvd, mode, rows, dim)[:2]
    if mode.startswith("sharded"):
        sharding = "row" if mode == "sharded-row" else "auto"
        specs = {"f%d" % i: (n, dim, "sum") for i, n in enumerate(rows)}
        tables = hvd.parallel.ShardedEmbeddingCollection(specs, sharding=sharding, optimizer="sgd", lr=LR)
    else:
        tables = ReplicatedTables(rows, dim)
    model = DLRM(tables, dim)
    if mode == "allgather":
        return model, HorovodSparseOptimizer(hvd, model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR),
        named_parameters=model.named_parameters(),
        sparse_as_dense=(mode == "dense"),
    )
    return model, opt


def _bytes_per_step(mode, model, ids, n, rows, dim):
    if mode.startswith(("sharded", "ps")):
        t = model.embeddings.traffic()
        return (t["id_bytes"] + t["row_bytes"] + t["other_bytes"] + t["replica_bytes"]) / max(t["steps"], 1)
    if mode == "allgather":  # every id looked up, as Horovod's torch gathers them
        return sum((n - 1) * v.numel() * (dim * 4 + 8) for v in ids.values())
    return 2 * (n - 1) / n * sum(rows) * dim * 4


def time_dlrm_steps(comm, gate, model, opt, rows, args):
    """Times args.steps training steps of `model` (after 2 warm-up steps) on this rank's 4
    synthetic batches, in turn; the same data and step for every library's worker. Returns
    (times, load, batches)."""
    gen = torch.Generator().manual_seed(comm.rank)
    batches = [make_batch(gen, rows, args.batch) for _ in range(4)]
    state = {"i": 0}

    def step():
        dense, ids, labels = batches[state["i"] % len(batches)]
        state["i"] += 1
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(model(dense, ids), labels).backward()
        opt.step()

    times, load = timed_steps(comm, gate, step, args.steps, args.idle_wait, warmup=2)
    return times, load, batches


def measure_ps(comm, gate, args, hvd, rows):
    """A ps mode: the workers time their steps; each server serves one step per timed call."""
    torch.manual_seed(0)
    model, opt, tables = _ps_model(hvd, args.mode, rows, args.dim)
    if model is None:
        times, load = timed_steps(
            comm, gate, lambda: tables.serve(steps=1), args.steps, args.idle_wait, warmup=2
        )
        tables.serve()  # until the workers stop it
        t = tables.traffic()
        sent = (t["id_bytes"] + t["row_bytes"] + t["other_bytes"] + t["replica_bytes"]) / max(t["steps"], 1)
    else:
        times, load, batches = time_dlrm_steps(comm, gate, model, opt, rows, args)
        tables.stop_servers()
        sent = _bytes_per_step(args.mode, model, batches[0][1], comm.size, rows, args.dim)
    table_bytes = sum(b.numel() * 4 for b in tables.buffers())
    if tables.replicas is not None and tables.replicas.replica is not None:
        table_bytes += sum(w.numel() * 4 for w in tables.replicas.replica.weights)
    return step_doc(comm, times, load, sent=sent, table_bytes=table_bytes)


def measure(comm, gate, args):
    import hvdlite.torch as hvd

    rows = table_rows(args.min_rows, args.max_rows)
    if args.mode.startswith("ps"):
        return measure_ps(comm, gate, args, hvd, rows)
    model, opt = _model(hvd, args.mode, rows, args.dim)
    times, load, batches = time_dlrm_steps(comm, gate, model, opt, rows, args)
    sent = _bytes_per_step(args.mode, model, batches[0][1], comm.size, rows, args.dim)
    table_bytes = sum(b.numel() * 4 for b in model.embeddings.buffers()) + sum(
        p.numel() * 4 for n, p in model.embeddings.named_parameters()
    )
    return step_doc(comm, times, load, sent=sent, table_bytes=table_bytes)


def main():
    run(measure, add=_add, setup=lambda: torch.set_num_threads(1))


if __name__ == "__main__":
    sys.exit(main())
