"""Expert parallelism (hvd.parallel.MoE) on 4 real ranks against a naive single-process
reference (a per-token loop over all tokens and all experts, built from the same seed):
outputs, auxiliary loss, expert counts, input gradients and every parameter gradient (after
DistributedOptimizer's reduction) agree for ep=4, ep=2 and dp=2 x ep=2, dropless and with
capacity (the reference drops the same tokens), k=1 and k=2, with a member holding zero
tokens and an expert receiving none; the batched local experts equal the loop; and a
small causal MoE GPT (attention + MoE FFN) trains on dp=2 x ep=2 with its loss going down
and its replicas identical where they should be."""

import math

import pytest
from helpers import run_pooled

RTOL, ATOL = 1e-5, 1e-6
H = 6


def _factory():
    from torch import nn

    return nn.Sequential(nn.Linear(H, 10), nn.GELU(), nn.Linear(10, H))


def _reference(cfg):
    """Gate and all experts exactly as MoE builds them under torch.manual_seed(0)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    gate = nn.Linear(H, cfg["E"], bias=False)
    base = int(torch.randint(0, 2**62, (1,)).item())
    experts = []
    for g in range(cfg["E"]):
        torch.manual_seed(base + g)
        experts.append(_factory())
    return gate, experts


def _reference_forward(gate, experts, x, cfg):
    """Per-token loop: top-k, priority = slot then token order, capacity, weighted sum."""
    import torch

    E, k, n = cfg["E"], cfg["k"], x.shape[0]
    logits = gate(x).float()
    probs = torch.softmax(logits, dim=-1)
    top_p, top_i = probs.topk(k, dim=-1)
    w = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
    cap = None
    if cfg["drop"]:
        cap = max(cfg["min_cap"], math.ceil(cfg["cf"] * n * k / E))
    fill = [0] * E
    kept = [[False] * k for _ in range(n)]
    for s in range(k):
        for t in range(n):
            e = int(top_i[t, s])
            if cap is None or fill[e] < cap:
                kept[t][s] = True
                fill[e] += 1
    rows = []
    for t in range(n):
        acc = torch.zeros(H)
        for s in range(k):
            if kept[t][s]:
                acc = acc + w[t, s] * experts[int(top_i[t, s])](x[t : t + 1])[0]
        rows.append(acc)
    out = torch.stack(rows) if rows else torch.zeros(0, H)
    routed = torch.bincount(top_i.reshape(-1), minlength=E).float()
    aux = cfg["aux"] * E * (routed * probs.sum(0)).sum() / (n * n * k)
    aux = aux + cfg["z"] * torch.logsumexp(logits, -1).square().mean()
    return out, aux, torch.tensor(fill, dtype=torch.int64), n * k - sum(fill)


def _case(hvd, cfg, ps, stats_ps, expert_dp_ps):
    """Runs one configuration; returns the largest deviations from the reference."""
    import torch

    tokens = cfg["tokens"]  # tokens of each member of the statistics set
    gate, experts = _reference(cfg)
    torch.manual_seed(0)
    moe = hvd.parallel.MoE(
        H, expert=_factory, num_experts=cfg["E"], k=cfg["k"], capacity_factor=cfg["cf"],
        min_capacity=cfg["min_cap"], drop_tokens=cfg["drop"], aux_loss_coef=cfg["aux"],
        z_loss_coef=cfg["z"], process_set=ps, stats_process_set=stats_ps,
        expert_dp_process_set=expert_dp_ps, name=cfg["name"],
    )  # fmt: skip
    torch.manual_seed(100)
    x_all = torch.randn(sum(tokens), H)
    probe_all = torch.randn(sum(tokens), H)
    if cfg.get("zero_expert"):  # expert E-1 never chosen: feature 0 is +5, its logit -50
        x_all[:, 0] = 5.0
        with torch.no_grad():
            gate.weight[-1] = 0.0
            gate.weight[-1, 0] = -10.0
            moe.gate.weight.copy_(gate.weight)
    me = stats_ps.rank()
    lo, n = sum(tokens[:me]), tokens[me]
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(moe.parameters(), lr=0.0),
        named_parameters=[(cfg["name"] + "." + k, p) for k, p in moe.named_parameters()],
        process_set=stats_ps,
    )
    x = x_all[lo : lo + n].clone().requires_grad_()
    out, aux, counts = moe(x)
    ((out * probe_all[lo : lo + n]).sum() + aux / stats_ps.size()).backward()
    opt.synchronize()

    x_ref = x_all.clone().requires_grad_()
    ref_out, ref_aux, ref_counts, dropped = _reference_forward(gate, experts, x_ref, cfg)
    ((ref_out * probe_all).sum() + ref_aux).backward()
    W = stats_ps.size()  # DistributedOptimizer averaged over it: every grad is ref / W
    errs = {
        "out": _err(out, ref_out[lo : lo + n]),
        "aux": _err(aux, ref_aux),
        "x.grad": _err(x.grad, x_ref.grad[lo : lo + n]),
        "gate.grad": _err(moe.gate.weight.grad * W, gate.weight.grad),
    }
    for i, module in enumerate(moe.experts):
        ref_params = list(experts[moe.first_expert + i].parameters())
        for j, (p, q) in enumerate(zip(module.parameters(), ref_params)):
            errs["expert%d.p%d.grad" % (moe.first_expert + i, j)] = _err(p.grad * W, q.grad)
    return {
        "errs": errs,
        "counts": counts.tolist(),
        "ref_counts": ref_counts.tolist(),
        "dropped": dropped,
        "runs": dict(moe.expert_runs),
        "local_experts": moe.num_local_experts,
    }


def _batched_vs_loop(hvd, ps):
    """The same layer (4 local experts per member, one of them receiving no rows) run once
    batched and once with batch_experts=False: outputs and every gradient, per member."""
    import torch

    torch.manual_seed(0)
    moe = hvd.parallel.MoE(
        H, expert=_factory, num_experts=8, k=2, drop_tokens=False, process_set=ps, name="bvl"
    )
    torch.manual_seed(200 + ps.rank())
    x = torch.randn(5 + 4 * ps.rank(), H)
    with torch.no_grad():  # no token chooses expert 7 (the last member's local expert 3)
        moe.gate.weight[7] = -moe.gate.weight[:7].abs().sum(dim=0) - 1.0
        x.abs_()
    probe = torch.randn(x.shape[0], H)
    results = []
    for batch in (None, False):
        moe.batch_experts = batch
        moe.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        out, aux, counts = moe(xi)
        ((out * probe).sum() + aux).backward()
        grads = [p.grad.clone() for p in moe.parameters()]
        results.append([out.detach(), xi.grad] + grads)
    close = all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(*results))
    worst = max(float((a - b).abs().max()) if a.numel() else 0.0 for a, b in zip(*results))
    return {"runs": dict(moe.expert_runs), "close": close, "worst": worst, "counts": counts.tolist()}


def _err(a, b):
    import torch

    if b is None:  # the reference never used that expert: its gradient is zero
        b = torch.zeros_like(a)
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return float(((a - b).abs() / (ATOL + RTOL * b.abs())).max()) if not torch.equal(a, b) else 0.0


CASES = {
    # name: (mesh dp, mesh ep, config)
    "ep4_k2_dropless_zeros": (1, 4, dict(E=8, k=2, drop=False, tokens=[5, 7, 0, 6], zero_expert=True)),
    "ep4_k1_capacity": (1, 4, dict(E=4, k=1, drop=True, cf=0.75, min_cap=1, tokens=[6, 6, 6, 6])),
    "ep2_k2_capacity": (2, 2, dict(E=4, k=2, drop=True, cf=0.75, min_cap=1, tokens=[7, 4], ep_stats=True)),
    "ep2_k1_dropless": (2, 2, dict(E=4, k=1, drop=False, tokens=[0, 9], ep_stats=True)),
    "dp2ep2_k2_dropless": (2, 2, dict(E=4, k=2, drop=False, tokens=[4, 6, 3, 5])),
    "dp2ep2_k2_capacity": (2, 2, dict(E=4, k=2, drop=True, cf=1.0, min_cap=2, tokens=[6, 6, 6, 6])),
}


def _cases_body():
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    results = {}
    meshes = {}
    for name, (dp, ep, extra) in CASES.items():
        cfg = dict(cf=1.0, min_cap=1, aux=0.01, z=0.001, name=name)
        cfg.update(extra)
        if (dp, ep) not in meshes:
            meshes[(dp, ep)] = hvd.Mesh(dp=dp, ep=ep)
        mesh = meshes[(dp, ep)]
        ps = mesh.process_set("ep")
        if cfg.get("ep_stats"):  # each ep group is its own global batch, experts unreplicated
            stats_ps, expert_dp = ps, None
        else:
            stats_ps, expert_dp = mesh.process_set(("dp", "ep")), (mesh.process_set("dp") if dp > 1 else None)
        results[name] = _case(hvd, cfg, ps, stats_ps, expert_dp)
    results["batched_vs_loop"] = _batched_vs_loop(hvd, meshes[(2, 2)].process_set("ep"))
    hvd.shutdown()
    return results


@pytest.fixture(scope="module")
def case_results():
    return run_pooled(_cases_body, 4, timeout=120)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_single_process_reference(case_results, name):
    for rank, results in enumerate(case_results):
        r = results[name]
        bad = {k: v for k, v in r["errs"].items() if not v <= 1.0}
        assert not bad, "rank %d %s: deviations (in tolerances) %s" % (rank, name, bad)
        assert r["counts"] == r["ref_counts"], (rank, name, r)
        if CASES[name][2]["drop"]:
            assert r["dropped"] > 0, "the capacity case must drop tokens to test dropping"
        # every case with more than one local expert takes the batched path (the default)
        want = {"batched": 1, "loop": 0} if r["local_experts"] > 1 else {"batched": 0, "loop": 1}
        assert r["runs"] == want, (rank, name, r["runs"])
    if CASES[name][2].get("zero_expert"):
        assert case_results[0][name]["ref_counts"][-1] == 0


def test_batched_experts_equal_the_loop(case_results):
    for rank, results in enumerate(case_results):
        r = results["batched_vs_loop"]
        assert r["runs"] == {"batched": 1, "loop": 1}, (rank, r)
        assert r["close"], (rank, r)
        assert r["counts"][7] == 0 and sum(r["counts"][:4]) > 0 and sum(r["counts"][4:]) > 0, (rank, r)


def _tiny_gpt(hvd, mesh, V, S, D):
    """A one-block causal GPT: token + position embeddings, pre-norm causal self-attention
    (2 heads), pre-norm MoE FFN (4 experts, top-2, capacity), final norm, head."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class TinyMoEGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.pos = nn.Embedding(V, D), nn.Embedding(S, D)
            self.ln1, self.ln2, self.lnf = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
            # no qkv bias: the key bias's gradient is zero up to rounding noise, which Adam
            # would turn into full-size steps that differ between ZeRO and allreduce
            self.qkv, self.proj = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D)
            self.moe = hvd.parallel.MoE(
                D, expert=lambda: nn.Sequential(nn.Linear(D, 32), nn.GELU(), nn.Linear(32, D)),
                num_experts=4, k=2, capacity_factor=1.5, min_capacity=2,
                process_set=mesh.process_set("ep"), expert_dp_process_set=mesh.process_set("dp"),
                stats_process_set=mesh.process_set(("dp", "ep")), name="gpt.moe",
            )  # fmt: skip
            self.head = nn.Linear(D, V)

        def forward(self, ids):
            b, s = ids.shape
            x = self.emb(ids) + self.pos(torch.arange(s))
            q, k, v = self.qkv(self.ln1(x)).reshape(b, s, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, s, D))
            y, aux, _ = self.moe(self.ln2(x))
            return self.head(self.lnf(x + y)), aux

    return TinyMoEGPT()


def _train(hvd, mesh, use_zero, steps=20):
    """Trains a tiny causal MoE GPT (next-token prediction on sequences following
    x[t+1] = (3 x[t] + 1) mod V from random starts, this rank's own data); returns its
    losses, its parameters after 3 steps and at the end, and how its experts ran."""
    import torch
    import torch.nn.functional as F

    V, S, D = 16, 8, 16
    torch.manual_seed(0)
    model = _tiny_gpt(hvd, mesh, V, S, D)
    if use_zero:
        opts = [
            o
            for o in hvd.parallel.moe_zero_optimizers(
                model, lambda ps: torch.optim.Adam(ps, lr=0.01), stage=2
            )
            if o is not None
        ]
    else:
        opts = [
            hvd.DistributedOptimizer(
                torch.optim.Adam(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
            )
        ]
    gen = torch.Generator().manual_seed(10 + hvd.rank())
    losses, early = [], None
    for step in range(steps):
        ids = [torch.randint(0, V, (8,), generator=gen)]
        for _ in range(S - 1):
            ids.append((ids[-1] * 3 + 1) % V)
        ids = torch.stack(ids, dim=1)  # [8, S]
        logits, aux = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1)) + aux
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        losses.append(float(loss.detach()))
        if step == 2:
            early = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    final = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return {"losses": losses, "early": early, "params": final, "runs": dict(model.moe.expert_runs)}


def _train_body():
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    mesh = hvd.Mesh(dp=2, ep=2)
    out = {"ddp": _train(hvd, mesh, use_zero=False), "zero": _train(hvd, mesh, use_zero=True)}
    hvd.shutdown()
    return out


@pytest.fixture(scope="module")
def train_results():
    return run_pooled(_train_body, 4, timeout=120)


@pytest.mark.parametrize("kind", ["ddp", "zero"])
def test_training_loss_goes_down_and_replicas_agree(train_results, kind):
    from numpy import array_equal as equal

    res = [r[kind] for r in train_results]
    for r in res:
        assert r["runs"] == {"batched": 20, "loop": 0}, r["runs"]
        first, last = sum(r["losses"][:3]) / 3, sum(r["losses"][-3:]) / 3
        assert last < 0.7 * first, r["losses"]
    for name, p in res[0]["params"].items():
        if ".experts." in name:  # ranks 0 and 2 hold experts 0-1, ranks 1 and 3 experts 2-3
            assert equal(p, res[2]["params"][name]), name
            assert equal(res[1]["params"][name], res[3]["params"][name]), name
            assert not equal(p, res[1]["params"][name]), name
        else:
            for r in res[1:]:
                assert equal(p, r["params"][name]), name


def test_zero_matches_distributed_optimizer(train_results):
    """moe_zero_optimizers (ZeRO-2, experts sharded over their dp set) takes the same steps
    as DistributedOptimizer (to reduce-scatter vs allreduce rounding) over 3 steps."""
    import numpy as np

    for r in train_results:
        for name, p in r["ddp"]["early"].items():
            np.testing.assert_allclose(r["zero"]["early"][name], p, rtol=1e-4, atol=1e-5, err_msg=name)
