"""Elastic training with ZeRO-sharded state (hvdlite/torch/parallel/zero/elastic.py, buddy copies
in hvdlite/torch/elastic/buddy.py): the placement and recovery rules as pure functions (fast),
and one elastic job of 4 workers on 2 hosts losing a host mid-run, stages 1, 2 and 3 trained side
by side in it (tests/elastic_zero_train.py; slow)."""

import itertools
import json
import os
import sys

import numpy as np
import pytest
from helpers import run_pooled
from test_elastic import REPO, hvdliterun, worker_lines

from hvdlite.common.exceptions import HvdliteInternalError, PreconditionError, ShardsLostError
from hvdlite.torch.elastic.buddy import choose_sources, holders

pytestmark = pytest.mark.elastic


def test_buddies_sit_on_another_host_and_each_rank_keeps_one():
    hosts = ["a", "a", "b", "b"]
    h = holders(hosts)
    assert sorted(h) == [0, 1, 2, 3]  # one copy kept per rank
    assert all(hosts[i] != hosts[h[i]] for i in range(4))
    uneven = ["a", "a", "a", "b", "b", "c", "c", "c"]
    h = holders(uneven)
    assert sorted(h) == list(range(8)) and all(uneven[i] != uneven[h[i]] for i in range(8))
    assert holders(["a", "a", "a"]) == [1, 2, 0]  # one host: the next rank
    assert holders(["a"]) == [0]


def _info(pos, version, holder, buddy_version=None, own=None):
    buddy_of = holder.index(pos)
    own = [version - 1, version] if own is None else own
    # as BuddyCopies.info() gives them: the versions its buddy copies hold (0, a half-written one: none)
    buddy = version if buddy_version is None else buddy_version
    buddy = [v for v in (buddy if isinstance(buddy, list) else [buddy]) if v]
    return (pos, len(holder), own, buddy_of, buddy, holder, 10)


def test_survivors_rebuild_from_own_and_buddy_copies():
    holder = holders(["a", "a", "b", "b"])  # [2, 3, 0, 1]
    version, source = choose_sources([_info(0, 7, holder), _info(1, 7, holder)])
    assert version == 7 and source == {0: 0, 1: 1, 2: 0, 3: 1}
    # the usual cut-short commit: a rank died before commit 8's exchange (the barrier failed):
    # own copies of 7 and 8, buddy copies of 7 intact: commit 7 is rebuilt
    infos = [_info(0, 8, holder, buddy_version=7), _info(1, 8, holder, buddy_version=7), None]
    assert choose_sources(infos) == (7, {0: 0, 1: 1, 2: 0, 3: 1})
    # rank 3 died during commit 8's exchange itself: rank 1's buddy copy (of rank 3) half written
    infos = [_info(0, 8, holder), _info(1, 8, holder, buddy_version=0)]
    with pytest.raises(ShardsLostError, match="rank 3's shard has no copy of the same commit"):
        choose_sources(infos)
    # with buddy_overlap each rank also keeps the previous buddy copy: rank 3 died while commit
    # 8's exchange was still running (rank 0's arrived, rank 1's did not): commit 7 is rebuilt
    infos = [_info(0, 8, holder, buddy_version=[7, 8]), _info(1, 8, holder, buddy_version=[7])]
    assert choose_sources(infos) == (7, {0: 0, 1: 1, 2: 0, 3: 1})
    infos = [_info(0, 8, holder, buddy_version=[8, 7]), _info(1, 8, holder, buddy_version=[7, 8])]
    assert choose_sources(infos) == (8, {0: 0, 1: 1, 2: 0, 3: 1})


def test_losing_a_rank_and_its_buddy_is_a_clear_error_not_retried():
    holder = holders(["a", "b", "c"])  # one rank per host: [1, 2, 0]
    with pytest.raises(ShardsLostError) as e:
        choose_sources([_info(0, 3, holder)])  # hosts b and c lost together
    text = str(e.value)
    assert "rank 1 and rank 2 (which kept its buddy copy) were both lost" in text
    assert "hvd.load_checkpoint" in text and "hvd.save_checkpoint" in text
    assert not isinstance(e.value, HvdliteInternalError)  # hvd.elastic.run retries only those


def _max_rel(got, want):
    return max(float(np.max(np.abs(np.array(got) - want)) / np.max(np.abs(want))), 0.0)


def _reference(train, steps):
    """One process, plain AdamW, the same global batches."""
    import torch

    net = train.model()
    opt = train.optimizer(net.parameters())
    for step in steps:
        x, y = train.batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in net.state_dict().items()}


# ~10 s each: one job, three ZeroOptimizers (stages 1, 2, 3) and a plain DistributedOptimizer in
# one TorchState, commit every step. The host is lost mid-step 5, or inside step 4's commit between
# two optimizers' buddy exchanges (then one copy of that commit never arrives, and the survivors
# rebuild step 3's commit from the second buddy buffers and train on from there). The "hosts"
# share this machine's /dev/shm: the first case keeps the buddy copies in mapped files (the
# default), the second sends them point-to-point (HVDLITE_BUDDY_SHARED_MEMORY=0), as across
# machines.
@pytest.mark.slow
@pytest.mark.parametrize("kill", ["ELASTIC_KILL", "ELASTIC_KILL_IN_EXCHANGE"])
def test_zero_stages_survive_a_lost_host_from_buddy_copies(tmp_path, kill):
    pytest.importorskip("torch")
    sys.path.insert(0, str(REPO / "tests"))
    import elastic_zero_train as train

    from hvdlite.torch.parallel.zero.checkpoint import consolidate_checkpoint

    script = str(REPO / "tests" / "elastic_zero_train.py")
    env = {
        kill: "127.0.0.1[0]:%d" % (5 if kill == "ELASTIC_KILL" else 4),
        "ELASTIC_STEPS": "12",
        "ELASTIC_CKPT": str(tmp_path / "ckpt"),
        "HVDLITE_BUDDY_SHARED_MEMORY": "1" if kill == "ELASTIC_KILL" else "0",
    }
    hosts = "localhost:2,127.0.0.1:2"
    res = hvdliterun("-np", 4, "--min-np", 2, "-H", hosts, sys.executable, script, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "generation 2: 2 worker(s): localhost[0], localhost[1]" in res.stderr, res.stderr[-4000:]
    done = next(
        json.loads(line[5:])
        for lines in worker_lines(res.stdout).values()
        for line in lines
        if line.startswith("DONE ")
    )
    assert done["shared"] == [kill == "ELASTIC_KILL"] * 3, done["shared"]
    log = done["log"]
    assert [s for s, _, _ in log] == list(range(12)), log  # every committed step exactly once
    sizes = [n for _, n, _ in log]
    if kill == "ELASTIC_KILL":
        assert sizes == [4] * 5 + [2] * 7, log
    else:
        assert sizes == [4] * 4 + [2] * 8, log
    gaps = [b[2] - a[2] for a, b in itertools.pairwise(log)]
    print(
        "longest gap between commits: %.3f s (recovery), median %.3f s"
        % (max(gaps), sorted(gaps)[len(gaps) // 2])
    )
    want = _reference(train, [s for s, _, _ in log])
    for stage, full in zip(train.STAGES, done["full"]):
        for key, value in want.items():
            err = _max_rel(full[key], value)
            print("stage %d %s: max relative difference %.2e" % (stage, key, err))
            assert err <= 2e-4, (stage, key, err)
    for key, value in want.items():  # plain data parallelism, in the same job
        err = _max_rel(done["plain"][key], value)
        print("plain DP %s: max relative difference %.2e" % (key, err))
        assert err <= 2e-4, ("plain", key, err)
    # each survivor holds half of the optimizer state (AdamW: 2 elementwise tensors, padded shards)
    for per_rank in done["sizes"]:
        for elements in per_rank:
            assert 2 * done["params"] / 2 <= elements <= 2 * (done["params"] / 2 + 2), done["sizes"]
    saved = consolidate_checkpoint(str(tmp_path / "ckpt"))  # checkpoints work after resharding
    for key, value in saved.items():
        np.testing.assert_allclose(value.numpy(), np.array(done["full"][-1][key]), rtol=0, atol=0)


# ~6 s: two of three one-slot hosts die in the same step; rank 1's shard and its buddy copy (on
# rank 2) are both gone, so the survivor stops with ShardsLostError instead of re-forming forever.
@pytest.mark.slow
def test_losing_a_rank_with_its_buddy_ends_the_job_naming_both():
    script = str(REPO / "tests" / "elastic_zero_train.py")
    env = {"ELASTIC_KILL": "127.0.0.1[0]:3,127.0.0.2[0]:3", "ELASTIC_STEPS": "8"}
    hosts = "localhost:1,127.0.0.1:1,127.0.0.2:1"
    res = hvdliterun("-np", 3, "--min-np", 1, "-H", hosts, sys.executable, script, env=env, timeout=120)
    assert res.returncode != 0
    assert "ShardsLostError" in res.stderr, res.stderr[-4000:]
    assert "rank 1 and rank 2 (which kept its buddy copy) were both lost" in res.stderr, res.stderr[-4000:]
    assert "hvd.load_checkpoint" in res.stderr
    assert "DONE" not in res.stdout


def test_old_shards_reshard_to_any_new_size():
    """segments()/assemble() (the rebuild's arithmetic, no processes): buckets sharded over 4
    ranks, packed as commit() packs them (master then one state key per bucket), rebuilt for 3
    and 2 ranks, give the new shards of the same flat buffers with zero padding."""
    torch = pytest.importorskip("torch")
    from hvdlite.torch.parallel.zero.elastic import assemble, segments
    from hvdlite.torch.parallel.zero.shard import Bucket

    numels, old_n = [10, 7, 1], 4
    flats = [
        [torch.arange(n, dtype=torch.float32) + 100 * i + 1000 * r for r in range(2)]
        for i, n in enumerate(numels)
    ]

    def shard(n, count):
        return max(1, -(-n // count))

    meta = [(["exp_avg"], {"step": 3}, shard(n, old_n)) for n in numels]
    packed = []
    for j in range(old_n):
        parts = []
        for (_, _, sh), rows in zip(meta, flats):
            for flat in rows:
                padded = torch.cat([flat, torch.zeros(sh * old_n - flat.numel())])
                parts.append(padded[j * sh : (j + 1) * sh])
        packed.append(torch.cat(parts))
    for new_n in (3, 2):
        buckets = [Bucket(i, 0, [], n, shard(n, new_n), new_n) for i, n in enumerate(numels)]
        for me in range(new_n):
            pieces = {
                j: [packed[j][a:b] for *_, a, b in segments(buckets, meta, j, me)] for j in range(old_n)
            }
            rows = assemble(buckets, meta, pieces, me)
            for b, flat_rows in zip(buckets, flats):
                for r, flat in enumerate(flat_rows):
                    padded = torch.cat([flat, torch.zeros(b.padded_numel - flat.numel())])
                    want = padded[me * b.shard_numel : (me + 1) * b.shard_numel]
                    assert torch.equal(rows[b.index][r], want), (new_n, me, b.index, r)


def _buddy_exchange():
    import torch

    import hvdlite.torch as hvd
    from hvdlite.torch.elastic.buddy import BuddyCopies, RecoveryPlan

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = []
    for shared, overlap in itertools.product((False, True), (False, True)):
        os.environ["HVDLITE_BUDDY_SHARED_MEMORY"] = "1" if shared else "0"
        copies = BuddyCopies(overlap=overlap)
        for version in (1, 2, 3):  # later commits reuse every buffer
            copies.commit(
                [torch.full((3,), 10.0 * r + version), torch.arange(2.0) + r], hvd.global_process_set
            )
        plan = copies.recover(hvd.global_process_set)  # waits for an exchange still running
        # as if every owner were lost: each shard comes from the rank keeping its buddy copy
        holder = copies.holder
        whole = {}
        for version in (3, 2) if overlap or shared else (3,):  # the previous buddy copy is kept too
            by_buddy = RecoveryPlan(copies, plan.infos, version, {j: holder[j] for j in range(n)}, r)
            got = by_buddy.fetch_whole({k: [(k + 1) % n] for k in range(n)}, hvd.global_process_set)
            whole[version] = {j: t.tolist() for j, t in got.items()}
        info = copies.info()
        out.append((plan.version, info[2], info[4], whole, copies._shared is not None))
        copies.forget_placement()
    os.environ.pop("HVDLITE_BUDDY_SHARED_MEMORY")
    hvd.shutdown()
    return out


def test_buddy_copies_rebuild_a_shard_from_its_buddy():
    """BuddyCopies on 3 ranks (no launcher hosts: one host, buddies are the next rank), copies
    sent (HVDLITE_BUDDY_SHARED_MEMORY=0) without and with overlap, and mapped from the owner's
    /dev/shm files: three commits, then every rank takes over its neighbour's whole shard from
    the buddy copy (with overlap or mapped, also the previous commit's)."""
    results = run_pooled(_buddy_exchange, 3, timeout=60)
    for r, modes in enumerate(results):
        j = (r + 1) % 3
        for (shared, overlap), got_mode in zip(itertools.product((False, True), (False, True)), modes):
            version, own_versions, buddy_versions, whole, mapped = got_mode
            assert mapped == shared, (shared, overlap)
            assert version == 3 and sorted(own_versions) == [2, 3]
            assert sorted(buddy_versions) == ([2, 3] if overlap or shared else [3])
            for v, got in whole.items():
                assert got == {j: [10.0 * j + v] * 3 + [0.0 + j, 1.0 + j]}, (shared, overlap, v)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("hvdlite-") and "-buddy" in f]  # unlinked


def test_a_shared_shard_is_one_set_of_pages_and_its_version_marks_a_complete_copy():
    import torch

    from hvdlite.torch.elastic.buddy_shm import SharedShard, name_prefix

    name = name_prefix(0) + "-test"
    own = SharedShard(name, 5, torch.float32, True)
    try:
        with pytest.raises(FileExistsError):
            SharedShard(name, 5, torch.float32, True)
        with pytest.raises(PreconditionError, match="bytes, not"):
            SharedShard(name, 6, torch.float32, False)
        buddy = SharedShard(name, 5, torch.float32, False)
        assert buddy.version == 0  # fresh: no complete copy
        own.data.copy_(torch.arange(5.0))
        own.version = 7
    finally:
        own.unlink()
    del own  # the owner is gone and the name too: the buddy's mapping still holds the copy
    assert buddy.version == 7 and buddy.data.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
