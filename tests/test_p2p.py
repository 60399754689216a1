"""Point-to-point send/recv (csrc/runtime/p2p.h, hvdlite/common/p2p.py): matching by
tag out of order, a sender that never waits for the receiver, grouped ring shifts, large
messages over shared memory (through the point-to-point arena and the control ring) and over TCP, process-set ranks, and errors that name the
tensor, the pair and the tag (bad rank, size mismatch, unmatched recv, a dead sender)."""

import os
import signal
import time

import numpy as np
import pytest
from helpers import TF_SPAWN_ENV, run_pooled, run_ranks


def _core_cases(big_elems):
    import hvdlite as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    peer = 1 - r
    out = {}
    # 1. Out of order by tag: rank 0 sends tag 1 then tag 0; rank 1 receives tag 0 first.
    if r == 0:
        hvd.send(np.full(3, 11.0, np.float32), 1, tag=1)
        hvd.send(np.full(3, 10.0, np.float32), 1, tag=0)
    else:
        a, b = np.zeros(3, np.float32), np.zeros(3, np.float32)
        hvd.recv(a, 0, tag=0)
        hvd.recv(b, 0, tag=1)
        out["tags"] = (a.tolist(), b.tolist())
    # 2. A send completes before the receiver posts its recv: rank 1 posts the recv of tag 7
    #    only after receiving tag 8, which rank 0 sends after its send of tag 7 has returned
    #    (a sender that waited for the receiver to post would never get there).
    if r == 0:
        hvd.send(np.arange(4, dtype=np.int64), 1, tag=7)
        hvd.send(np.zeros(1, np.uint8), 1, tag=8)
    else:
        hvd.recv(np.ones(1, np.uint8), 0, tag=8)
        out["late_recv"] = hvd.recv(np.zeros(4, np.int64), 0, tag=7).tolist()
    # 3. Grouped ring shift (both directions at once), several MiB each way.
    big = np.arange(big_elems, dtype=np.float32) + r * 1e6
    into = np.empty_like(big)
    hs = hvd.batch_isend_irecv(
        [hvd.P2POp(hvd.send, big, (r + 1) % n, tag=3), hvd.P2POp(hvd.recv, into, (r - 1) % n, tag=3)]
    )
    res = [hvd.synchronize(h) for h in hs]
    out["ring_ok"] = bool(np.array_equal(into, np.arange(big_elems, dtype=np.float32) + peer * 1e6))
    out["ring_results"] = (res[0], res[1] is into)
    # 4. Async forms, a non-contiguous receive, a zero-length message, and a message to itself.
    h = hvd.recv_async(np.zeros((4, 2), np.float64)[:, 0], peer, tag=5)
    hvd.send(np.array([1.5, 2.5, 3.5, 4.5]) * (peer + 1), peer, tag=5)
    out["strided"] = hvd.synchronize(h).tolist()
    hvd.send(np.zeros(0, np.float32), peer, tag=6)
    out["empty"] = hvd.recv(np.zeros(0, np.float32), peer, tag=6).shape
    self_h = hvd.send_async(np.full(2, r, np.int32), r, tag=9)
    out["self"] = hvd.recv(np.zeros(2, np.int32), r, tag=9).tolist()
    hvd.synchronize(self_h)
    # 5. Process-set ranks: in the singleton set [r], this rank is rank 0 (job rank 1 too);
    #    rank 1 of it does not exist. (4 ranks, slow: pairs whose set ranks differ.)
    sets = [hvd.add_process_set([0]), hvd.add_process_set([1])]
    mine = sets[r]
    hvd.send(np.full(2, 100 + r, np.int16), 0, tag=0, process_set=mine)
    out["set"] = hvd.recv(np.zeros(2, np.int16), 0, tag=0, process_set=mine).tolist()
    try:
        hvd.send(np.ones(1), 0, process_set=sets[peer])
        out["not_member"] = None
    except hvd.InvalidArgumentError as e:
        out["not_member"] = str(e)
    # 6. Errors: a rank outside the set, a negative tag, a size mismatch.
    for bad in (lambda: hvd.send(np.ones(1), 5), lambda: hvd.recv(np.ones(1), 0, tag=-1)):
        try:
            bad()
            out.setdefault("bad", []).append(None)
        except hvd.InvalidArgumentError as e:
            out.setdefault("bad", []).append(str(e))
    if r == 0:
        hvd.send(np.ones(5, np.float32), 1, tag=4, name="grad")
    else:
        try:
            hvd.recv(np.ones(4, np.float32), 0, tag=4, name="grad")
            out["mismatch"] = None
        except hvd.MismatchError as e:
            out["mismatch"] = str(e)
    # 7. Collectives still work around point-to-point traffic.
    out["allreduce"] = hvd.allreduce(np.ones(2), op=hvd.Sum).tolist()
    hvd.shutdown()
    return out


def _check_core(results, big_elems):
    r0, r1 = results
    assert r1["tags"] == ([10.0] * 3, [11.0] * 3)
    assert r1["late_recv"] == [0, 1, 2, 3]
    for r in results:
        assert r["ring_ok"] and r["ring_results"] == (None, True)
        assert r["empty"] == (0,)
        assert r["allreduce"] == [2.0, 2.0]
    assert r0["strided"] == [1.5, 2.5, 3.5, 4.5] and r1["strided"] == [3.0, 5.0, 7.0, 9.0]
    assert r0["self"] == [0, 0] and r1["self"] == [1, 1]
    assert r0["set"] == [100, 100] and r1["set"] == [101, 101]
    assert "rank 1 is not a member of process set" in r1["not_member"]
    for r in results:
        assert "dst 5 is not a rank of process set 0" in r["bad"][0]
        assert "tag -1 is negative" in r["bad"][1]
    msg = r1["mismatch"]
    assert "'recv.grad'" in msg or "'grad'" in msg
    assert "from rank 0" in msg and "tag 4" in msg and "20 bytes" in msg and "16" in msg


# Shared memory: through the point-to-point arena (16 MiB: 4 MiB pieces), a 64 KiB arena (16 KiB
# pieces: it wraps hundreds of times, and senders wait for room), and without it (the control ring).
@pytest.mark.parametrize("arena", [None, 64 << 10, 0], ids=["arena", "small_arena", "control_ring"])
def test_p2p_two_ranks_shm(arena):
    big = 3 * (1 << 20)  # 12 MiB each way
    env = {} if arena is None else {"HVDLITE_P2P_ARENA_BYTES": str(arena)}
    _check_core(run_pooled(_core_cases, 2, args=(big,), timeout=120, env=env), big)


def test_p2p_two_ranks_tcp():
    big = 3 * (1 << 20)
    _check_core(run_pooled(_core_cases, 2, args=(big,), timeout=120, env={"HVDLITE_SHM_DISABLE": "1"}), big)


def _send_then_shutdown():
    import hvdlite as hvd

    hvd.init()
    got = None
    if hvd.rank() == 0:  # 4 MiB: more than the window, so most of it moves after send_async returned
        h = hvd.send_async(np.arange(1 << 20, dtype=np.float32), 1, tag=2)
        hvd.synchronize(h)
    else:
        time.sleep(0.3)
        got = hvd.recv(np.zeros(1 << 20, np.float32), 0, tag=2)
        got = bool(np.array_equal(got, np.arange(1 << 20, dtype=np.float32)))
    hvd.shutdown()  # rank 0 gets here while rank 1 still sleeps
    return got


def test_sender_may_shut_down_before_the_receiver_posts():
    assert run_pooled(_send_then_shutdown, 2, timeout=60)[1] is True


def _with_steady_state():
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    r = hvd.rank()
    ok = True
    for i in range(40):  # a training loop: one allreduce and one exchange per step
        total = hvd.allreduce(np.full(3, float(r + i)), op=hvd.Sum, name="grad")
        got = np.zeros(2)
        hs = hvd.batch_isend_irecv(
            [hvd.P2POp("send", np.full(2, 10.0 * r + i), 1 - r, tag=i), hvd.P2POp("recv", got, 1 - r, tag=i)]
        )
        for h in hs:
            hvd.synchronize(h)
        ok &= total.tolist() == [2.0 * i + 1] * 3 and got.tolist() == [10.0 * (1 - r) + i] * 2
    scheduled = runtime_stats()["scheduled_responses"]
    hvd.shutdown()
    return ok, scheduled


def test_p2p_leaves_the_steady_state_alone():
    for ok, scheduled in run_pooled(_with_steady_state, 2, timeout=60):
        assert ok and scheduled > 20  # the allreduces ran from the schedule, p2p beside them


def _unmatched():
    import hvdlite as hvd

    hvd.init()
    out = None
    if hvd.rank() == 0:
        hvd.send(np.ones(2), 1, tag=1)
    else:
        try:
            hvd.recv(np.ones(2), 0, tag=2, name="act")
        except TimeoutError as e:  # an HvdliteTimeoutError, caught as Python's TimeoutError
            out = str(e) if isinstance(e, hvd.HvdliteTimeoutError) else "not hvdlite's: %r" % e
        hvd.recv(np.ones(2), 0, tag=1)  # the job goes on
    hvd.shutdown()
    return out


def test_unmatched_recv_names_the_pair_and_tags():
    msg = run_pooled(_unmatched, 2, timeout=60, env={"HVDLITE_TIMEOUT_SECONDS": "1.5"})[1]
    assert "from rank 0 with tag 2" in msg and "'act'" in msg
    assert "tags received from it and not matched: 1" in msg


def _over_the_bound():
    import hvdlite as hvd

    hvd.init()
    out = None
    try:
        if hvd.rank() == 0:
            hvd.send(np.ones(300, np.float32), 1, tag=5)  # 1200 bytes nobody has asked for yet
            hvd.barrier()  # fails: rank 1 broke the job
        else:
            hvd.recv(np.ones(1), 0, tag=4)
    except hvd.HvdliteError as e:
        out = str(e)
    hvd.shutdown()
    return out


def test_unexpected_messages_are_bounded():
    msgs = run_pooled(_over_the_bound, 2, timeout=60, env={"HVDLITE_P2P_UNEXPECTED_BYTES": "1000"})
    assert "HVDLITE_P2P_UNEXPECTED_BYTES" in msgs[1] and "from rank 0 with tag 5" in msgs[1]
    assert "rank 1" in msgs[0]


def _dead_sender():
    import hvdlite as hvd

    hvd.init()
    if hvd.rank() == 0:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        hvd.recv(np.ones(2), 0, tag=0)
    except hvd.HvdliteError as e:
        return str(e)
    return None


def test_dead_sender_is_named():
    with pytest.raises(AssertionError) as info:  # rank 0 was killed: run_ranks reports it
        run_ranks(_dead_sender, 2, timeout=60)
    text = str(info.value)
    assert "rank 0" in text and ("closed its connection" in text or "failed" in text)


def _torch_cases():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    r = hvd.rank()
    peer = 1 - r
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r
    got = torch.zeros(2, 3)
    hs = hvd.batch_isend_irecv([hvd.P2POp(hvd.recv, got, peer, tag=2), hvd.P2POp(hvd.send, x, peer, tag=2)])
    for h in hs:
        hvd.synchronize(h)
    t = torch.zeros(3, dtype=torch.bfloat16)
    if r == 0:
        hvd.send(torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16), 1)
    else:
        hvd.recv(t, 0)
    hvd.shutdown()
    return got.tolist(), t.float().tolist()


def test_torch_adapter():
    (g0, _), (g1, t1) = run_pooled(_torch_cases, 2, timeout=60)
    assert g0 == [[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]] and g1 == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert t1 == [1.0, 2.0, 3.0]


def _tf_cases():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    hvd.init()
    r = hvd.rank()
    peer = 1 - r
    h = hvd.send_async(tf.constant([1.0, 2.0]) + r, peer, tag=1)
    eager = hvd.recv(tf.zeros([2]), peer, tag=1).numpy().tolist()
    hvd.synchronize(h)

    @tf.function
    def exchange(x):
        if r == 0:
            hvd.send(x, 1, tag=2)
            return x
        return hvd.recv(x, 0, tag=2)

    graph = exchange(tf.constant([5, 6, 7], tf.int32) * (r + 1)).numpy().tolist()
    v = tf.Variable(tf.zeros([2]))
    if r == 0:
        hvd.send(tf.constant([8.0, 9.0]), 1, tag=3)
    else:
        hvd.recv(v, 0, tag=3)
    hvd.shutdown()
    return eager, graph, v.numpy().tolist()


def test_tensorflow_adapter():
    pytest.importorskip("tensorflow")
    (e0, g0, v0), (e1, g1, v1) = run_pooled(_tf_cases, 2, timeout=120, spawn_env=TF_SPAWN_ENV)
    assert e0 == [2.0, 3.0] and e1 == [1.0, 2.0]
    assert g0 == [5, 6, 7] and g1 == [5, 6, 7]  # rank 1 received what rank 0 passed in
    assert v0 == [0.0, 0.0]
    assert v1 == [8.0, 9.0]


def _ring_four(big_elems):
    import hvdlite as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    # odd ranks as a process set whose set ranks differ from job ranks: [1, 3] -> set ranks 0, 1
    odd = hvd.add_process_set([1, 3])
    x = np.full(big_elems, r, np.float64)
    into = np.empty_like(x)
    hs = hvd.batch_isend_irecv(
        [hvd.P2POp("send", x, (r + 1) % n, tag=r), hvd.P2POp("recv", into, (r - 1) % n, tag=(r - 1) % n)]
    )
    for h in hs:
        hvd.synchronize(h)
    pair = None
    if r in (1, 3):
        me = odd.rank()
        hvd.send(np.array([r]), 1 - me, process_set=odd)
        pair = int(hvd.recv(np.array([0]), 1 - me, process_set=odd)[0])
    hvd.shutdown()
    return float(into[0]), float(into[-1]), pair


@pytest.mark.slow
def test_ring_and_process_set_on_four_ranks():
    res = run_pooled(_ring_four, 4, args=(1 << 20,), timeout=120)
    assert [x[0] for x in res] == [3.0, 0.0, 1.0, 2.0]
    assert [x[1] for x in res] == [3.0, 0.0, 1.0, 2.0]
    assert res[1][2] == 3 and res[3][2] == 1
