"""Process sets: collectives on subgroups involve only their members, and
collectives submitted in different orders on different ranks still match."""

import numpy as np
from helpers import run_pooled


def _subgroups():
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    even = hvd.add_process_set([0, 2])
    odd = hvd.add_process_set(hvd.ProcessSet([1, 3]))
    mine = even if r % 2 == 0 else odd
    out = {
        "ids": (even.process_set_id, odd.process_set_id),
        "size": mine.size(),
        "rank_in": mine.rank(),
        "included": (even.included(), odd.included()),
    }
    # interleave subgroup and global collectives, submitted in a rank-dependent order
    hs = []
    order = [0, 1, 2] if r < 2 else [2, 1, 0]
    for i in order:
        if i == 1:
            hs.append(("g", hvd.allreduce_async(np.full(3, r, np.float32), op=hvd.Sum, name="global")))
        else:
            hs.append(
                (
                    "s%d" % i,
                    hvd.allreduce_async(
                        np.full(2, r, np.float32), op=hvd.Sum, name="sub%d" % i, process_set=mine
                    ),
                )
            )
    out["results"] = {k: hvd.synchronize(h).tolist() for k, h in hs}
    out["gather"] = hvd.allgather(np.array([r]), process_set=mine).tolist()
    out["bcast"] = hvd.broadcast(np.array([r, r]), root_rank=mine.ranks[-1], process_set=mine).tolist()
    try:
        hvd.allreduce(np.ones(1), name="not-mine", process_set=odd if mine is even else even)
        out["non_member"] = None
    except hvd.HvdliteError as e:
        out["non_member"] = str(e)
    hvd.barrier(process_set=mine)
    assert hvd.remove_process_set(even) and hvd.remove_process_set(odd)
    try:
        hvd.allreduce(np.ones(1), process_set=even)
        out["removed"] = None
    except hvd.HvdliteError as e:
        out["removed"] = type(e).__name__
    again = hvd.add_process_set([0, 1, 2])
    out["again"] = again.process_set_id
    if r < 3:
        out["again_sum"] = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=again).tolist()
    hvd.shutdown()
    return out


def test_process_sets_on_four_ranks():
    results = run_pooled(_subgroups, 4, timeout=90)
    for r, out in enumerate(results):
        assert out["ids"] == (1, 2)
        assert out["size"] == 2 and out["rank_in"] == r // 2
        assert out["included"] == (r % 2 == 0, r % 2 == 1)
        members = [0, 2] if r % 2 == 0 else [1, 3]
        assert out["results"]["g"] == [6.0] * 3
        assert out["results"]["s0"] == out["results"]["s2"] == [float(sum(members))] * 2
        assert out["gather"] == members
        assert out["bcast"] == [members[-1]] * 2
        assert out["non_member"] is not None and "not a member" in out["non_member"]
        assert out["removed"] == "PreconditionError"
        assert out["again"] == 1  # even's id, freed first (Horovod's rule: see the test below)
        if r < 3:
            assert out["again_sum"] == [3.0]


def _reused_ids():
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    a, b, c = (hvd.add_process_set(ranks) for ranks in ([0, 1], [1, 2], [0, 2]))
    out = {"first": [a.process_set_id, b.process_set_id, c.process_set_id]}
    # Three times, so that the core caches (set 3, "x") and then sends it as a cache id.
    if r in c.ranks:
        out["x_before"] = [
            hvd.allreduce(np.full(2, r + 1.0), op=hvd.Sum, name="x", process_set=c).tolist() for _ in range(3)
        ]
    assert hvd.remove_process_set(c) and hvd.remove_process_set(a)  # frees 3, then 1
    d, e, f = (hvd.add_process_set(ranks) for ranks in ([2], [0], [0, 1]))
    out["reused"] = [d.process_set_id, e.process_set_id, f.process_set_id]
    # The same name on the reused id 3, now of other members: the core must not mix the two sets up.
    if r in d.ranks:
        out["x_after"] = [
            hvd.allreduce(np.full(2, r + 1.0), op=hvd.Sum, name="x", process_set=d).tolist() for _ in range(3)
        ]
    if r in f.ranks:  # and a set that got a new id
        out["f_sum"] = hvd.allreduce(np.full(1, r + 1.0), op=hvd.Sum, name="x", process_set=f).tolist()
    out["table"] = hvd.common.basics._get_process_set_ids_and_ranks()
    hvd.shutdown()
    return out


def test_removed_ids_are_reused_oldest_first_as_in_horovod():
    """Horovod's ProcessSetTable: a removed set's id goes to a FIFO queue; a new set takes the
    queue's head, else the next unused id."""
    for r, out in enumerate(run_pooled(_reused_ids, 3, timeout=60)):
        assert out["first"] == [1, 2, 3]
        assert out["reused"] == [3, 1, 4]
        assert out["table"] == {0: [0, 1, 2], 1: [0], 2: [1, 2], 3: [2], 4: [0, 1]}
        if r in (0, 2):
            assert out["x_before"] == [[4.0, 4.0]] * 3
        if r == 2:
            assert out["x_after"] == [[3.0, 3.0]] * 3
        if r < 2:
            assert out["f_sum"] == [3.0]


def _reversed_order():
    import hvdlite as hvd

    hvd.init()
    names = ["t%d" % i for i in range(30)]
    if hvd.rank() == 1:
        names.reverse()
    handles = {
        n: hvd.allreduce_async(np.full(50 + int(n[1:]), int(n[1:]), np.int64), op=hvd.Sum, name=n)
        for n in names
    }
    out = {n: hvd.synchronize(h) for n, h in handles.items()}
    hvd.shutdown()
    return {n: (v.shape[0], int(v[0])) for n, v in out.items()}


def test_ranks_submitting_in_opposite_orders_agree():
    for out in run_pooled(_reversed_order, 2, timeout=60):
        assert out == {"t%d" % i: (50 + i, 2 * i) for i in range(30)}


def _mismatched_add():
    import hvdlite as hvd

    hvd.init()
    try:
        hvd.add_process_set([0, 1] if hvd.rank() == 0 else [0, 2])
        got = None
    except hvd.HvdliteError as e:
        got = str(e)
    ok = hvd.allreduce(np.ones(1), op=hvd.Sum).tolist()
    hvd.shutdown()
    return got, ok


def test_add_process_set_with_different_ranks_is_an_error():
    for got, ok in run_pooled(_mismatched_add, 3, timeout=60):
        assert got is not None and "add_process_set" in got
        assert ok == [3.0]


def _duplicates():
    """A user's duplicate set is refused (Horovod's ValueError); an add-on's own set (registered
    with allow_duplicate) neither is refused nor makes the user's set with its ranks a duplicate."""
    import hvdlite as hvd

    hvd.init()
    addon = hvd.add_process_set([0, 1], allow_duplicate=True)
    user = hvd.add_process_set([0, 1])
    try:
        hvd.add_process_set([0, 1])
        again = None
    except ValueError as e:
        again = str(e)
    ids = (addon.process_set_id, user.process_set_id)
    hvd.shutdown()
    return ids, again


def test_duplicate_sets_are_refused_unless_an_addon_owns_the_first():
    for (addon_id, user_id), again in run_pooled(_duplicates, 3, timeout=60):
        assert addon_id != user_id and addon_id > 0
        assert again is not None and "duplicate of the registered process set %d" % user_id in again


def _static_sets():
    import os

    import hvdlite as hvd
    from hvdlite.common import basics

    out = {}
    r = int(os.environ["HVDLITE_RANK"])
    for case, sets in (
        ("differ", [[0], [1]] if r == 0 else [[1], [0]]),
        ("duplicate", [[0], hvd.ProcessSet([1, 0])]),
    ):
        try:
            hvd.init(process_sets=sets)
            out[case] = None
        except ValueError as e:
            out[case] = str(e)
        out[case + "_initialized"] = hvd.is_initialized()  # as in Horovod: with the global set only
        out[case + "_sum"] = hvd.allreduce(np.ones(1), op=hvd.Sum).tolist()
    hvd.init(process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet([1])])  # consistent: works
    out["ids"] = basics._get_process_set_ids_and_ranks()
    try:
        hvd.add_process_set([1])
    except ValueError as e:
        out["dup_add"] = str(e)
    out["sum"] = hvd.allreduce(np.ones(1), op=hvd.Sum).tolist()
    hvd.shutdown()
    return out


def test_static_process_sets_are_checked_on_every_rank():
    for out in run_pooled(_static_sets, 2, timeout=60):
        assert "rank 0 gave [[0], [1]]" in out["differ"] and "rank 1 gave [[1], [0]]" in out["differ"]
        assert "entry 1" in out["duplicate"] and "global process set" in out["duplicate"]
        assert out["differ_initialized"] and out["duplicate_initialized"]
        assert out["differ_sum"] == out["duplicate_sum"] == [2.0]
        assert out["ids"] == {0: [0, 1], 1: [0], 2: [1]}
        assert "duplicate of the registered process set 2" in out["dup_add"]
        assert out["sum"] == [2.0]
