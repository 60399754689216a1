"""The parameter-server mode of sharded embedding tables on 3 real ranks: rank 0 serves the
table (serve()), ranks 1 and 2 train a pooled embedding + a dense layer, the dense layer's
gradients allreduced among the workers only (DistributedOptimizer on a worker process set).
With staleness 0 the table and the dense layer equal one process on the whole batch; with
staleness k the table equals one process that applies each step's table gradient k steps late
(rows read at step t miss the last k steps' updates), and stop_servers() applies the rest.
Also: a table sharded over a process set of two of the three ranks."""

import pytest
from helpers import run_pooled

V, D, BAGS, STEPS, LR = 40, 4, 3, 4, 0.1


def _batch(torch, step):
    g = torch.Generator().manual_seed(50 + step)
    ids = (torch.rand(2 * BAGS, 3, generator=g) ** 2 * V).long()
    return ids, torch.randn(2 * BAGS, 1, generator=g)


def _reference(torch, table, dense, staleness):
    """One process, the workers' whole batch; table updates (row-wise Adagrad) applied
    `staleness` steps late, the dense layer's (SGD) at once."""
    import torch.nn.functional as F

    W, lin = table.clone(), {k: v.clone() for k, v in dense.items()}
    s, pending = torch.zeros(V), []

    def apply(G):
        s.add_(G.pow(2).mean(1))
        W.sub_(LR * G / (s.sqrt() + 1e-10).unsqueeze(1))

    for step in range(STEPS):
        ids, y = _batch(torch, step)
        w = W.clone().requires_grad_(True)
        lw, lb = (lin[k].clone().requires_grad_(True) for k in ("weight", "bias"))
        F.mse_loss(F.linear(F.embedding_bag(ids, w, mode="sum"), lw, lb), y).backward()
        pending.append(w.grad)
        with torch.no_grad():
            lin["weight"] -= LR * lw.grad
            lin["bias"] -= LR * lb.grad
            while len(pending) > staleness:
                apply(pending.pop(0))
    with torch.no_grad():
        for G in pending:
            apply(G)
    return W, lin


def _job(staleness):
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    hvd.init()
    workers = hvd.add_process_set([1, 2])
    torch.manual_seed(0)
    table, lin = torch.nn.EmbeddingBag(V, D, mode="sum"), torch.nn.Linear(D, 1)
    dense0 = {k: v.detach().clone() for k, v in lin.state_dict().items()}
    table0 = table.weight.detach().clone()
    emb = hvd.parallel.ShardedEmbeddingBag.from_dense(
        table, optimizer="adagrad", lr=LR, servers=[0], staleness=staleness, name="ps%d" % staleness
    )
    out = {"server_bytes": emb.memory_bytes()}
    if emb.is_server:
        out["served"] = emb.serve()
    else:
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(lin.parameters(), lr=LR),
            named_parameters=lin.named_parameters(),
            process_set=workers,
        )
        me = workers.rank()
        for step in range(STEPS):
            ids, y = _batch(torch, step)
            mine = slice(me * BAGS, (me + 1) * BAGS)
            opt.zero_grad()
            F.mse_loss(lin(emb(ids[mine])), y[mine]).backward()
            opt.step()
        emb.stop_servers()
    full = emb.full_weight()
    W, ref_lin = _reference(torch, table0, dense0, staleness)
    out["table_err"] = float((full - W).abs().max() / W.abs().max())
    if not emb.is_server:
        out["dense_err"] = max(float((lin.state_dict()[k] - ref_lin[k]).abs().max()) for k in ref_lin)
    if not emb.is_server:
        out["subset_err"] = _sharded_over_a_subset(hvd, torch, workers)
    hvd.remove_process_set(workers)
    hvd.shutdown()
    return out


def _sharded_over_a_subset(hvd, torch, workers):
    """A table row-sharded over a process set of two of the three ranks (the workers) trains
    as one process on the set's whole batch."""
    import torch.nn.functional as F

    torch.manual_seed(1)
    dense = torch.nn.EmbeddingBag(V, D, mode="mean")
    emb = hvd.parallel.ShardedEmbeddingBag.from_dense(dense, sharding="row", process_set=workers, lr=LR)
    ids, y = _batch(torch, 0)
    mine = slice(workers.rank() * BAGS, (workers.rank() + 1) * BAGS)
    F.mse_loss(emb(ids[mine]).sum(1), y[mine, 0]).backward()
    w = dense.weight.detach().clone().requires_grad_(True)
    F.mse_loss(F.embedding_bag(ids, w, mode="mean").sum(1), y[:, 0]).backward()
    W = dense.weight.detach() - LR * w.grad
    return float((emb.full_weight() - W).abs().max() / W.abs().max())


@pytest.mark.parametrize("staleness", [0, 2])
def test_parameter_server_equals_one_process(staleness):
    results = run_pooled(_job, 3, args=(staleness,), timeout=120)
    server, *workers = results
    assert server["served"] == STEPS
    assert server["server_bytes"]["table"] == V * D * 4 and server["server_bytes"]["optimizer"] == V * 4
    for rank, r in enumerate(results):
        assert r["table_err"] <= 1e-6, (rank, r)
    for r in workers:
        assert r["server_bytes"] == {"table": 0, "optimizer": 0}
        assert r["dense_err"] <= 1e-6, r
        assert r["subset_err"] <= 1e-6, r
