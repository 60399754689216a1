"""Sharded embedding tables (hvd.parallel.ShardedEmbeddingBag / ShardedEmbedding /
ShardedEmbeddingCollection) on real ranks against one process holding the whole table:
N ranks, each on its slice of a global batch, update the table as a dense nn.EmbeddingBag
trained on the whole batch with the same optimizer rule (SGD and row-wise Adagrad within 1e-6
relative, lazy Adam within 1e-5), for row, column and table sharding, bag modes sum and mean
and plain lookups, with duplicate ids within and across ranks and empty bags. Also: memory per
rank is 1/N of the table and its optimizer state, the bytes a step sends stay within the
issue's bound, an id outside the table is an error on every rank, and the planner's choices."""

import pytest
from helpers import run_pooled

V, D, BAGS, STEPS, LR = 53, 7, 5, 3, 0.1
OPTIONS = {"sgd": {}, "adagrad": {"eps": 1e-10}, "adam": {"betas": (0.9, 0.999), "eps": 1e-8}}
TOLERANCE = {"sgd": 1e-6, "adagrad": 1e-6, "adam": 1e-5}
CASES = [
    (sharding, optimizer, mode)
    for sharding in ("row", "column", "table")
    for optimizer in ("sgd", "adagrad", "adam")
    for mode in ("sum", "mean", None)
]
# the default run: every sharding with every optimizer, the modes rotating among them
DEFAULT_CASES = [c for i, c in enumerate(CASES) if i % 3 == (i // 3) % 3]


def _global_batch(torch, step, members, mode):
    """Bags of 0-5 ids (empty bags included) drawn from a skewed distribution, so ids repeat
    within a bag, within a rank and across ranks."""
    g = torch.Generator().manual_seed(1000 + step)
    n = BAGS * members
    if mode is None:
        ids = (torch.rand(n, 3, generator=g) ** 3 * V).long()
        return ids, None, torch.randn(n, 3, D, generator=g)
    lengths = torch.randint(0, 6, (n,), generator=g)
    lengths[1] = 0
    ids = (torch.rand(int(lengths.sum()), generator=g) ** 3 * V).long()
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return ids, offsets, torch.randn(n, D, generator=g)


def _slice(ids, offsets, y, member):
    lo, hi = member * BAGS, (member + 1) * BAGS
    if offsets is None:
        return ids[lo:hi], None, y[lo:hi]
    end = offsets[hi] if hi < len(offsets) else len(ids)
    return ids[offsets[lo] : end], offsets[lo:hi] - offsets[lo], y[lo:hi]


def _reference_step(torch, W, state, ids, offsets, y, mode, optimizer):
    """One process, whole batch, dense gradient, the documented update rule."""
    import torch.nn.functional as F

    w = W.clone().requires_grad_(True)
    out = F.embedding(ids, w) if mode is None else F.embedding_bag(ids, w, offsets, mode=mode)
    F.mse_loss(out, y).backward()
    G = w.grad
    with torch.no_grad():
        if optimizer == "sgd":
            W -= LR * G
        elif optimizer == "adagrad":
            state["s"] += G.pow(2).mean(1)
            W -= LR * G / (state["s"].sqrt() + 1e-10).unsqueeze(1)
        else:
            rows = torch.unique(ids)
            state["t"] += 1
            b1, b2 = 0.9, 0.999
            state["m"][rows] = b1 * state["m"][rows] + (1 - b1) * G[rows]
            state["v"][rows] = b2 * state["v"][rows] + (1 - b2) * G[rows] ** 2
            step = LR * (1 - b2 ** state["t"]) ** 0.5 / (1 - b1 ** state["t"])
            W[rows] -= step * state["m"][rows] / (state["v"][rows].sqrt() + 1e-8)
    return out.detach()


def _run_case(hvd, torch, sharding, optimizer, mode, ps):
    import torch.nn.functional as F

    members, me = len(ps.ranks), ps.rank()
    torch.manual_seed(7)
    dense = torch.nn.Embedding(V, D) if mode is None else torch.nn.EmbeddingBag(V, D, mode=mode)
    W = dense.weight.detach().clone()
    state = {"s": torch.zeros(V), "m": torch.zeros(V, D), "v": torch.zeros(V, D), "t": 0}
    cls = hvd.parallel.ShardedEmbedding if mode is None else hvd.parallel.ShardedEmbeddingBag
    emb = cls.from_dense(
        dense, sharding=sharding, process_set=ps, optimizer=optimizer, lr=LR, **OPTIONS[optimizer]
    )
    out_err = 0.0
    for step in range(STEPS):
        ids, offsets, y = _global_batch(torch, step, members, mode)
        ref_out = _reference_step(torch, W, state, ids, offsets, y, mode, optimizer)
        my_ids, my_offsets, my_y = _slice(ids, offsets, y, me)
        out = emb(my_ids) if mode is None else emb(my_ids, my_offsets)
        F.mse_loss(out, my_y).backward()
        lo = me * BAGS
        out_err = max(out_err, float((out.detach() - ref_out[lo : lo + BAGS]).abs().max()))
    full = emb.full_weight()
    return {
        "err": float((full - W).abs().max() / W.abs().max()),
        "out_err": out_err,
        "moved": float((W - dense.weight.detach()).abs().max()),
        "full": full,
    }


def _equivalence_body(cases):
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    ps = hvd.global_process_set
    results = {case: _run_case(hvd, torch, *case, ps) for case in cases}
    hvd.shutdown()
    return results


def _check(results_per_rank, cases):
    for case in cases:
        first = results_per_rank[0][case]["full"]
        for rank, results in enumerate(results_per_rank):
            r = results[case]
            assert r["moved"] > 1e-3, (case, "the reference did not train")
            assert r["err"] <= TOLERANCE[case[1]], (case, rank, r["err"])
            assert r["out_err"] <= 1e-5, (case, rank, r["out_err"])
            assert bool((r["full"] == first).all()), (case, rank, "replicas differ")


def test_two_ranks_equal_one_process():
    _check(run_pooled(_equivalence_body, 2, args=(DEFAULT_CASES,), timeout=120), DEFAULT_CASES)


@pytest.mark.slow
def test_two_ranks_every_mode():
    _check(run_pooled(_equivalence_body, 2, args=(CASES,), timeout=120), CASES)


@pytest.mark.slow
def test_three_ranks_equal_one_process():
    _check(run_pooled(_equivalence_body, 3, args=(CASES,), timeout=240), CASES)


def _collection_body():
    """Three tables of different widths under the planner and a dict of shardings, plus
    memory, traffic and a bad id."""
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd
    from hvdlite.common import exceptions

    hvd.init()
    n, me = hvd.size(), hvd.rank()
    torch.manual_seed(3)
    dense = {
        "a": torch.nn.EmbeddingBag(40, 4, mode="sum"),
        "b": torch.nn.EmbeddingBag(1000, 8, mode="mean"),
        "c": torch.nn.Embedding(30, 6),
    }
    Ws = {k: m.weight.detach().clone() for k, m in dense.items()}
    out = {}
    for label, sharding in (("dict", {"a": "table", "b": "row", "c": "column"}), ("auto", "auto")):
        coll = hvd.parallel.ShardedEmbeddingCollection.from_dense(
            dense, sharding=sharding, optimizer="adagrad", lr=LR, memory_budget=10**6
        )
        refs = {k: W.clone() for k, W in Ws.items()}
        s = {k: torch.zeros(W.shape[0]) for k, W in Ws.items()}
        for step in range(2):
            g = torch.Generator().manual_seed(step)
            batch = {
                "a": torch.randint(0, 40, (2 * n, 3), generator=g),
                "b": torch.randint(0, 1000, (2 * n, 2), generator=g),
                "c": torch.randint(0, 30, (2 * n,), generator=g),
            }
            sl = slice(2 * me, 2 * me + 2)
            res = coll({k: v[sl] for k, v in batch.items()})
            sum(r.pow(2).mean() for r in res.values()).backward()
            for k, W in refs.items():  # one process, whole batch: the mean of the ranks' losses
                w = W.clone().requires_grad_(True)
                o = F.embedding(batch[k], w)
                o = o if k == "c" else (o.sum(1) if k == "a" else o.mean(1))
                o.pow(2).mean().backward()
                s[k] += w.grad.pow(2).mean(1)
                W -= LR * w.grad / (s[k].sqrt() + 1e-10).unsqueeze(1)
        out[label] = {
            k: float((coll.full_weight(k) - refs[k]).abs().max() / refs[k].abs().max()) for k in refs
        }
        out[label + "_layouts"] = {k: lay.sharding for k, lay in coll.layouts.items()}
    out["two_forwards"] = _two_forwards_one_backward(hvd, torch)
    out["memory"] = _memory(hvd, torch)
    out["traffic"] = _traffic(hvd, torch)
    try:
        coll(
            {"a": torch.tensor([[0]]), "b": torch.tensor([[5000 if me == 1 else 1]]), "c": torch.tensor([1])}
        )
        out["bad_id"] = None
    except exceptions.InvalidArgumentError as e:
        out["bad_id"] = str(e)
    hvd.shutdown()
    return out


def _two_forwards_one_backward(hvd, torch):
    """Two lookups in one graph (micro-batches summed into one loss): with SGD the table moves
    as one process moves it on the loss of both."""
    import torch.nn.functional as F

    n, me = hvd.size(), hvd.rank()
    torch.manual_seed(5)
    dense = torch.nn.EmbeddingBag(25, 3, mode="sum")
    emb = hvd.parallel.ShardedEmbeddingBag.from_dense(dense, sharding="row", optimizer="sgd", lr=LR)
    ids = torch.randint(0, 25, (4 * n, 2), generator=torch.Generator().manual_seed(9))
    mine = ids[4 * me : 4 * me + 4]
    (emb(mine[:2]).pow(2).mean() + emb(mine[2:]).pow(2).mean()).backward()
    w = dense.weight.detach().clone().requires_grad_(True)
    sum(
        F.embedding_bag(ids[4 * r + h : 4 * r + h + 2], w, mode="sum").pow(2).mean()
        for r in range(n)
        for h in (0, 2)
    ).backward()
    W = dense.weight.detach() - LR * w.grad / n
    return float((emb.full_weight() - W).abs().max() / W.abs().max())


def _memory(hvd, torch):
    """Bytes per rank of row- and column-sharded tables with Adagrad and Adam state."""
    n, got = hvd.size(), {}
    for sharding in ("row", "column"):
        for opt in ("adagrad", "adam"):
            emb = hvd.parallel.ShardedEmbeddingBag(
                64 * n, 4 * n, mode="sum", sharding=sharding, optimizer=opt
            )
            whole_state = {"adagrad": 64 * n * 4, "adam": 2 * 64 * n * 4 * n * 4}[opt]
            # row-wise Adagrad keeps one accumulator per row: under column sharding every
            # member holds all rows, so it holds every accumulator (1/dim of the table)
            state = whole_state if (sharding, opt) == ("column", "adagrad") else whole_state // n
            got[(sharding, opt)] = (
                emb.memory_bytes(),
                {"table": 64 * n * 4 * n * 4 // n, "optimizer": state},
            )
    return got


def _traffic(hvd, torch):
    """Bytes sent per step, as the core counted them, against (unique ids x dim x 4 x 2) + the
    ids' bytes; the collection's own count must be the core's."""
    from hvdlite.common.basics import runtime_stats

    n, me, dim = hvd.size(), hvd.rank(), 16
    emb = hvd.parallel.ShardedEmbeddingBag(10000, dim, mode="sum", sharding="row", optimizer="sgd")
    g = torch.Generator().manual_seed(me)
    ids = (torch.rand(4096, generator=g) ** 4 * 10000).long()
    before = runtime_stats()["alltoall_bytes_sent"]
    emb(ids, torch.arange(0, 4096, 8)).sum().backward()
    emb.full_weight()  # waits for the gradients' alltoall (an allgather itself)
    core = runtime_stats()["alltoall_bytes_sent"] - before
    unique = int(torch.unique(ids).numel())
    t = emb.traffic()
    return {
        "core": core,
        "sent": t["id_bytes"] + t["row_bytes"] + t["other_bytes"],
        "rows": t["row_bytes"],
        "bound_rows": 1.1 * unique * dim * 4 * 2,
        "id_bound": unique * 8,
        "ids": t["id_bytes"],
        "allgather_path": (n - 1) * 4096 * (dim * 4 + 8),
    }


def test_collection_planner_memory_traffic_and_bad_ids():
    results = run_pooled(_collection_body, 2, timeout=120)
    for rank, r in enumerate(results):
        for label in ("dict", "auto"):
            assert max(r[label].values()) <= 1e-6, (rank, label, r[label])
        assert r["dict_layouts"] == {"a": "table", "b": "row", "c": "column"}
        assert r["two_forwards"] <= 1e-6, (rank, r["two_forwards"])
        for key, (got, want) in r["memory"].items():
            assert got == want, (rank, key, got, want)
        assert r["traffic"]["sent"] < r["traffic"]["allgather_path"], (rank, r["traffic"])
        assert r["traffic"]["core"] == r["traffic"]["sent"], (rank, r["traffic"])
        assert r["bad_id"] and "[1]" in r["bad_id"], (rank, r["bad_id"])
    assert "id 5000" in results[1]["bad_id"]
    # the job's rows and gradients within 1.1 x (unique ids x dim x 4 x 2), ids within 8 bytes each
    # (the collection's counts, equal to the core's alltoall_bytes_sent above)
    total = {k: sum(r["traffic"][k] for r in results) for k in ("rows", "bound_rows", "ids", "id_bound")}
    assert total["rows"] <= total["bound_rows"] and total["ids"] <= total["id_bound"], total


def test_planner_places_by_size_and_budget():
    from hvdlite.common import exceptions
    from hvdlite.parallel.sparse import plan_tables

    tables = {"big": (10**6, 64), "mid": (10**4, 64), "small": (100, 16), "narrow": (3, 64)}
    plan = plan_tables(tables, 4, memory_budget=10**9, optimizer="adagrad")
    assert plan["big"].sharding == "row" and plan["small"].sharding == "table"
    assert plan["mid"].sharding == "table" and plan["narrow"].sharding == "table"
    assert plan["mid"].owner != plan["small"].owner or plan["narrow"].owner != plan["mid"].owner
    wide = plan_tables({"w": (3, 64), "x": (10, 4)}, 4)
    assert wide["w"].sharding == "column"
    with pytest.raises(exceptions.InvalidArgumentError, match="'big'"):
        plan_tables(tables, 4, memory_budget=10**6)


def _alike_bags_body(include_last):
    """Three bags of one mode and width (forward pools them by one embedding_bag): 2-D ids and
    (ids, offsets) with empty bags, against dense nn.EmbeddingBag modules on the whole batch."""
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    torch.manual_seed(3)
    dense = {
        k: torch.nn.EmbeddingBag(v, D, mode="sum", include_last_offset=include_last)
        for k, v in (("x", 31), ("y", 17), ("z", 53))
    }
    tables = hvd.parallel.ShardedEmbeddingCollection(dense, sharding="row", optimizer="sgd", lr=LR)
    g = torch.Generator().manual_seed(11)
    grid = {k: torch.randint(0, dense[k].num_embeddings, (BAGS * n, 2), generator=g) for k in ("x", "z")}
    lengths = torch.tensor([0, 3, 1, 0, 2] * n)
    ids_y = torch.randint(0, 17, (int(lengths.sum()),), generator=g)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    y = {k: torch.randn(BAGS * n, D, generator=g) for k in dense}

    def bags(k, lo, hi):  # bags [lo, hi) of table k as its module takes them
        if k != "y":
            ids = grid[k][lo:hi]
            if not include_last:
                return (ids,)
            return ids.reshape(-1), torch.arange(0, ids.numel() + 1, 2)
        offsets = starts[lo : hi + 1] - starts[lo]
        return ids_y[starts[lo] : starts[hi]], offsets if include_last else offsets[:-1]

    mine = tables({k: _one(bags(k, me * BAGS, (me + 1) * BAGS)) for k in dense})
    sum(F.mse_loss(mine[k], y[k][me * BAGS : (me + 1) * BAGS]) for k in dense).backward()
    whole = {k: dense[k](*bags(k, 0, BAGS * n)) for k in dense}
    sum(F.mse_loss(whole[k], y[k]) for k in dense).backward()
    out_err = max(float((mine[k] - whole[k][me * BAGS : (me + 1) * BAGS]).abs().max()) for k in dense)
    errs = {}
    for k, m in dense.items():
        want = m.weight.detach() - LR * m.weight.grad
        errs[k] = float((tables.full_weight(k) - want).abs().max() / want.abs().max())
    hvd.shutdown()
    return {"fused": tables.pooled_alike, "out_err": out_err, "errs": errs}


def _one(args):
    return args[0] if len(args) == 1 else args


@pytest.mark.parametrize("include_last", [False, True])
def test_alike_bags_pooled_at_once_equal_one_process(include_last):
    for rank, r in enumerate(run_pooled(_alike_bags_body, 2, args=(include_last,), timeout=120)):
        assert r["fused"], rank
        assert r["out_err"] <= 1e-5, (rank, r)
        assert max(r["errs"].values()) <= 1e-6, (rank, r)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_pooled_bags_backward_equals_embedding_bag(mode):
    """pool.pool_bags (one index_add backward) against F.embedding_bag's own backward, with
    repeated rows and empty bags (first, middle and last)."""
    import torch
    import torch.nn.functional as F

    from hvdlite.torch.parallel.sparse.pool import pool_bags

    g = torch.Generator().manual_seed(4)
    rows = torch.randn(9, D, generator=g)
    positions = torch.randint(0, 9, (23,), generator=g)
    offsets = torch.tensor([0, 0, 4, 5, 5, 11, 17, 23])
    y = torch.randn(len(offsets), D, generator=g)
    grads = []
    for pool in (
        lambda r: pool_bags(positions, r, offsets, mode),
        lambda r: F.embedding_bag(positions, r, offsets, mode=mode),
    ):
        r = rows.clone().requires_grad_(True)
        out = pool(r)
        F.mse_loss(out, y).backward()
        grads.append((out.detach(), r.grad))
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.allclose(grads[0][1], grads[1][1], rtol=1e-6, atol=1e-7)
