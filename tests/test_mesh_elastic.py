"""A hvd.Mesh job re-forms on the survivors of a loss (hvdlite/parallel/reform.py: the plan, pure;
hvdlite/torch/parallel/mesh/state.py: MeshState under hvd.elastic.run, real processes).

The slow tests run examples/pytorch_gpt_3d.py --elastic: pp=2 x tp=2 x dp=2, 8 ranks on 4
localhost "hosts" of 2 slots, with rank 5 SIGKILLed in step 3: the driver drops its host, the 6
survivors release 2 ranks, the last 4 finish; and pp=2 x tp=2 x dp=1 on 4 one-slot hosts and a
spare, rank 1 SIGKILLed in step 3: a replacement started on the spare takes its coordinate from
the buddy copy. In both every step's loss equals one process training the dense model on the
same global batches, to fp32 rounding."""

import re
import sys

import pytest
from helpers import run_pooled
from test_elastic import REPO, hvdliterun, worker_lines

from hvdlite.common.exceptions import NotSupportedError
from hvdlite.parallel import MeshLayout, reform

SIZES = {"pp": 2, "dp": 2, "ep": 1, "cp": 1, "tp": 2}


def _held(layout, ranks):
    """{new rank: (coordinate, old dp)} of the old ranks `ranks` renumbered 0.. in order."""
    return {i: (reform.key_of(layout.coords_of(r)), layout.coords_of(r).dp) for i, r in enumerate(ranks)}


def test_plan_shrinks_dp_keeps_a_holder_per_coordinate_and_releases_the_rest():
    old = MeshLayout(8, **SIZES)
    # host of ranks 4, 5 (stage 1 of replica 0) lost: stage 1 keeps replica 1 (old 6, 7)
    plan = reform.plan(SIZES, _held(old, [0, 1, 2, 3, 6, 7]))
    assert plan == reform.Plan(dp=1, members=[0, 1, 4, 5], released=[2, 3])
    # one rank lost (no host drop): tp0 of stage 0 has one replica left
    plan = reform.plan(SIZES, _held(old, [1, 2, 3, 4, 5, 6, 7]))
    assert plan.dp == 1 and plan.members == [1, 2, 3, 4] and plan.released == [0, 5, 6]
    # nothing lost: the identity; a worker holding nothing is released
    assert reform.plan(SIZES, _held(old, range(8))) == reform.Plan(2, list(range(8)), [])
    held = {**_held(old, range(8)), 8: None}
    assert reform.plan(SIZES, held).released == [8]
    # dp=4 x tp=2, rank 3 lost: dp shrinks to 3, the extra tp1 holder is released
    sizes = dict(SIZES, pp=1, dp=4)
    plan = reform.plan(sizes, _held(MeshLayout(8, **sizes), [0, 1, 2, 4, 5, 6, 7]))
    assert plan.dp == 3 and plan.members == [0, 1, 2, 4, 5, 6] and plan.released == [3]


def test_plan_keeps_expert_and_context_coordinates_apart():
    # ep=2 x cp=2 x dp=2: a coordinate is (pp, ep, cp, tp); dp replica 1 of (ep=1, cp=0) lost
    sizes = dict(SIZES, pp=1, tp=1, ep=2, cp=2)
    old = MeshLayout(8, **sizes)
    lost = old.rank_of(dp=1, ep=1, cp=0)
    plan = reform.plan(sizes, _held(old, [r for r in range(8) if r != lost]))
    assert plan.dp == 1 and plan.members == [0, 1, 2, 3] and plan.released == [4, 5, 6]


def test_plan_keeps_every_group_in_rank_order():
    # tp0 survives only in replica 1 (old rank 2), tp1 only in replica 0 (old 1): rank 2 cannot
    # hold tp0 before rank 1 holds tp1, so no layout fits these survivors
    sizes = dict(SIZES, pp=1)
    held = {0: ((0, 0, 0, 1), 0), 1: ((0, 0, 0, 0), 1)}
    with pytest.raises(NotSupportedError, match="cannot be laid out with every axis in rank order"):
        reform.plan(sizes, held)


def test_plan_names_a_coordinate_with_no_surviving_replica():
    sizes = dict(SIZES, dp=1)
    old = MeshLayout(4, **sizes)
    lost_from = {reform.key_of(old.coords_of(r)): [r] for r in range(4)}
    with pytest.raises(NotSupportedError) as e:
        reform.plan(sizes, _held(old, [0, 1, 2]), lost_from)
    text = str(e.value)
    assert "coordinate (pp=1, ep=0, cp=0, tp=1), held by rank(s) [3]" in text
    assert "dp is 1: there is no replica" in text and "last checkpoint" in text


def test_plan_gives_a_lost_coordinate_to_a_spare_and_asks_for_the_rank_order():
    sizes = dict(SIZES, dp=1)
    old = MeshLayout(4, **sizes)
    for dead in range(4):  # the driver numbers the survivors first, the replacement (3) last
        held = {**_held(old, [r for r in range(4) if r != dead]), 3: None}
        plan = reform.plan(sizes, held, spares=[3])
        assert (
            plan.dp == 1 and plan.restored == {3: reform.key_of(old.coords_of(dead))} and plan.released == []
        )
        if dead == 3:  # the last coordinate: rank 3 fits where it is
            assert plan.members == [0, 1, 2, 3] and plan.order is None
        else:  # the replacement must sit at the dead rank's place: the survivors keep their order
            want = [0, 1, 2]
            want.insert(dead, 3)
            assert plan.members is None and plan.order == want
    # in the order asked for, the replacement (now rank 1, holding nothing) fits
    held = {0: _held(old, [0])[0], 1: None, 2: _held(old, [2])[0], 3: _held(old, [3])[0]}
    plan = reform.plan(sizes, held, spares=[1])
    assert plan == reform.Plan(1, [0, 1, 2, 3], [], {1: (0, 0, 0, 1)})
    # a spare not needed is released; a coordinate with neither holder nor spare is an error
    assert reform.plan(sizes, {**_held(old, range(4)), 4: None}, spares=[4]).released == [4]
    lost = {reform.key_of(old.coords_of(1)): [1]}
    with pytest.raises(NotSupportedError) as e:
        reform.plan(
            sizes, _held(old, [0, 2, 3]), lost, detail={(0, 0, 0, 1): " (its buddy copy: old rank(s) [2])"}
        )
    text = str(e.value)
    assert "(pp=0, ep=0, cp=0, tp=1), held by rank(s) [1] (its buddy copy: old rank(s) [2])" in text
    assert "no replacement worker joined" in text and "last checkpoint" in text


def test_shard_copy_restores_model_and_optimizer_bit_exact():
    import torch

    from hvdlite.torch.parallel.mesh import shard_copy

    def build():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2))
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

    model, opt = build()
    for _ in range(2):
        model(torch.randn(4, 3)).square().sum().backward()
        opt.step()
    header, tensors, data = shard_copy.encode({"model": model.state_dict(), "optimizer": opt.state_dict()})
    capacity = shard_copy.size_of(header, data) + 100  # every rank's copy has the job's largest size
    flat = torch.cat(shard_copy.parts(header, tensors, capacity))
    assert flat.numel() == capacity
    got = shard_copy.decode(flat)
    fresh, fresh_opt = build()  # a replacement: the model built anew, an optimizer without state
    fresh.load_state_dict(got["model"])
    fresh_opt.load_state_dict(got["optimizer"])
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert a.dtype == b.dtype and torch.equal(a, b), k
    want, have = opt.state_dict(), fresh_opt.state_dict()
    assert want["param_groups"] == have["param_groups"]
    for i, entry in want["state"].items():
        for key, value in entry.items():
            assert value.dtype == have["state"][i][key].dtype and torch.equal(value, have["state"][i][key])


def _copies_body():
    import torch

    import hvdlite.torch as hvd
    from hvdlite.torch.parallel.mesh import shard_copy
    from hvdlite.torch.parallel.mesh.copies import MeshCopies

    hvd.init()
    me = hvd.rank()
    torch.manual_seed(me)
    model = torch.nn.Linear(2 + me, 3)  # shards of different sizes
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    copies = MeshCopies()
    skipped = copies.commit(
        {"model": model.state_dict(), "optimizer": opt.state_dict()}, {"step": 0}, me != 2
    )
    for step in (1, 2):
        model(torch.ones(1, 2 + me)).sum().backward()
        opt.step()
        copies.commit({"model": model.state_dict(), "optimizer": opt.state_dict()}, {"step": step}, True)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    version, flat = copies.fetch({0: 1, 1: 0, 2: 3, 3: 2})  # each rank takes a neighbour's shard
    got = shard_copy.decode(flat)
    theirs = [v.tolist() for v in got["model"].values()]
    momentum = [v["momentum_buffer"].shape for v in got["optimizer"]["state"].values()]
    return skipped, version, copies.plain_of(version), theirs, momentum, [v.tolist() for v in want.values()]


def test_mesh_copies_hand_a_shard_to_another_rank():
    results = run_pooled(_copies_body, 4)
    for r, (skipped, version, plain, theirs, momentum, _) in enumerate(results):
        peer = r ^ 1
        assert skipped is False  # rank 2's optimizer had no state yet: no rank committed
        assert version == 2 and plain == {"step": 2}
        assert theirs == results[peer][5]  # the peer's model as it committed it, bit for bit
        assert momentum == [(3, 2 + peer), (3,)]


def test_layout_over_members_places_coordinates_on_those_ranks():
    lay = MeshLayout(4, pp=2, dp=1, tp=2, members=[0, 1, 5, 6])
    assert lay.groups("tp") == [[0, 1], [5, 6]] and lay.groups("pp") == [[0, 5], [1, 6]]
    assert lay.coords_of(6) == (1, 0, 0, 0, 1) and lay.rank_of(pp=1, tp=0) == 5
    with pytest.raises(ValueError, match="rank 2 is not a member"):
        lay.coords_of(2)


def _reform_body():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    mesh = hvd.Mesh(pp=2, tp=2)
    tp, pp = mesh.process_set("tp"), mesh.process_set("pp")
    mesh.reform([0, 1, 2, 3], dp=1)  # same layout: the sets are removed and registered again
    assert mesh.process_set("tp") is tp and mesh.process_set("pp") is pp
    assert tp.process_set_id is not None and pp.process_set_id is not None
    got = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, process_set=tp).item()
    mesh.remove()
    return got, tp.ranks, pp.ranks


def test_mesh_reform_re_points_the_sets_it_handed_out():
    results = run_pooled(_reform_body, 4)
    assert results == [
        (1.0, [0, 1], [0, 2]),
        (1.0, [0, 1], [1, 3]),
        (5.0, [2, 3], [0, 2]),
        (5.0, [2, 3], [1, 3]),
    ]


GPT = ["--steps", "6", "--layers", "2", "--width", "16", "--heads", "2", "--seq", "16", "--batch", "4"]
GPT += ["--microbatches", "2", "--corpus-bytes", "100000", "--lr", "3e-3"]
STEP = re.compile(r"^step (\d+) loss (\S+) ranks (\d+)$")


def dense_losses(replicas=2):
    """The losses of one process training the dense GPT of the example (same seed, same
    initialisation order as its Stage) on the `replicas` replicas' batches of every step."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    sys.path.insert(0, str(REPO / "examples"))
    import pytorch_gpt_3d as ex

    args = _args(ex)
    torch.manual_seed(0)
    tok, pos = nn.Embedding(256, args.width), nn.Embedding(args.seq, args.width)
    blocks = nn.ModuleList(ex.Block(args.width, args.heads) for _ in range(args.layers))
    head, ln_f = nn.Linear(args.width, 256, bias=False), nn.LayerNorm(args.width)
    params = [
        *tok.parameters(),
        *pos.parameters(),
        *blocks.parameters(),
        *head.parameters(),
        *ln_f.parameters(),
    ]
    opt = torch.optim.AdamW(params, lr=args.lr)
    corpus, out = ex.load_corpus(args.corpus_bytes), []
    for step in range(args.steps):
        opt.zero_grad()
        total = 0.0
        for replica in range(replicas):
            x, y = ex.batch(corpus, args, step, replica)
            h = tok(x) + pos(torch.arange(x.shape[1]))
            for b in blocks:
                h = b(h)
            loss = F.cross_entropy(head(ln_f(h)).flatten(0, 1), y.flatten()) / replicas
            loss.backward()
            total += loss.item()
        opt.step()
        out.append(total)
    return out


def _args(ex):
    saved = sys.argv
    sys.argv = ["pytorch_gpt_3d.py", *GPT]
    try:
        return ex.parse_args()
    finally:
        sys.argv = saved


# Slow (~40 s on 2 cores, mostly 8 interpreters importing torch).
@pytest.mark.slow
def test_gpt_3d_loses_a_rank_and_finishes_on_four_with_the_same_losses():
    script = str(REPO / "examples" / "pytorch_gpt_3d.py")
    hosts = "localhost:2,127.0.0.1:2,127.0.0.2:2,127.0.0.3:2"
    argv = [sys.executable, script, "--dp", "2", "--elastic", "--kill-rank", "5", "--kill-step", "3"]
    res = hvdliterun("-np", 8, "--min-np", 4, "-H", hosts, *argv, *GPT, "--print-losses", timeout=150)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    steps = {}
    for lines in worker_lines(res.stdout).values():
        for line in lines:
            m = STEP.match(line)
            if m:  # a step printed twice (failed after printing, re-run) keeps its last print
                steps[int(m.group(1))] = (float(m.group(2)), int(m.group(3)))
    assert sorted(steps) == list(range(6)), res.stdout[-3000:]
    assert [steps[s][1] for s in range(6)] == [8, 8, 8, 4, 4, 4]
    assert "127.0.0.1[0] retired by its peers" in res.stderr and "generation 3: 4 worker(s)" in res.stderr
    assert (
        "released: rank(s) [2, 3]" in res.stderr and "this rank leaves the job (exit status 0)" in res.stderr
    )
    want = dense_losses()
    got = [steps[s][0] for s in range(6)]
    assert got == pytest.approx(want, rel=2e-5), (got, want)


# Slow (15 s on 2 cores: 5 interpreters importing torch, the replacement started mid-run, two
# re-formations).
@pytest.mark.slow
def test_gpt_3d_at_dp1_replaces_a_lost_rank_from_its_buddy_copy():
    script = str(REPO / "examples" / "pytorch_gpt_3d.py")
    hosts = "localhost:1,127.0.0.1:1,127.0.0.2:1,127.0.0.3:1,127.0.0.4:1"  # 127.0.0.4: the spare
    argv = [sys.executable, script, "--elastic", "--kill-rank", "1", "--kill-step", "3"]
    # --elastic-timeout: a failed replacement ends the job in seconds (no slot is left for another)
    res = hvdliterun(
        *("-np", 4, "--min-np", 4, "--max-np", 4, "--elastic-timeout", 20, "-H", hosts),
        *argv,
        *GPT,
        "--print-losses",
        timeout=150,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    committed, sizes = None, set()
    for lines in worker_lines(res.stdout).values():
        for line in lines:
            m = STEP.match(line)
            if m:
                sizes.add(int(m.group(3)))
            if line.startswith("committed losses "):
                committed = [float(v) for v in line.split()[2:]]
    assert sizes == {4}, res.stdout[-3000:]
    assert "generation 3: 4 worker(s): localhost[0], 127.0.0.4[0], 127.0.0.2[0], 127.0.0.3[0]" in res.stderr
    assert "(pp=0, ep=0, cp=0, tp=1) restored from buddy copies by rank(s) [3]" in res.stderr
    assert committed is not None and len(committed) == 6, res.stdout[-3000:]  # each step once
    want = dense_losses(replicas=1)
    assert committed == pytest.approx(want, rel=2e-5), (committed, want)
