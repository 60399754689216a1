"""Rank bodies of tests/test_torch_backend.py: torch.distributed code, unchanged, on the
"hvdlite" backend, each result checked against gloo in the same job (a gloo group of the same
ranks beside the default group), or against one process training on the whole batch."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def start(**kwargs):
    import hvdlite.torch  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group("hvdlite", **kwargs)
    return dist.get_rank(), dist.get_world_size()


def _values(dtype, n, r, shape=(5,)):
    """Rank-dependent values that every reduction keeps exact in `dtype`."""
    base = torch.arange(1, 1 + int(torch.tensor(shape).prod())).reshape(shape)
    return ((base + r) % 3 + 1).to(dtype)


def _allreduce_cases(r, n, gloo):
    out = {}
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    ops["product"] = dist.ReduceOp.PRODUCT
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16, torch.float16):
        for label, op in ops.items():
            mine, theirs = _values(dtype, n, r), _values(dtype, n, r)
            dist.all_reduce(mine, op=op)
            dist.all_reduce(theirs, op=op, group=gloo)
            out["%s.%s" % (dtype, label)] = torch.equal(mine, theirs)
    x = _values(torch.float32, n, r)
    s = x.clone()
    dist.all_reduce(x, op=dist.ReduceOp.AVG)  # gloo has no AVG: its sum over n
    dist.all_reduce(s, group=gloo)
    out["avg"] = torch.allclose(x, s / n)
    x = _values(torch.float32, n, r)
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
    out["premul_sum"] = torch.allclose(x, s * 0.5)
    a = [_values(torch.float32, n, r, (3, 2)), _values(torch.float32, n, r)]
    b = [t.clone() for t in a]
    dist.all_reduce_coalesced(a)
    for t in b:
        dist.all_reduce(t, group=gloo)
    out["coalesced"] = all(torch.equal(x, y) for x, y in zip(a, b))
    work = dist.all_reduce(x := _values(torch.float32, n, r), async_op=True)
    fut = work.get_future()
    work.wait(timeout=timedelta(seconds=30))
    out["async"] = work.is_completed() and torch.equal(fut.wait()[0], x) and work.exception() is None
    return out


def _gather_scatter_cases(r, n, gloo):
    out = {}

    def both(fn):
        return fn(None), fn(gloo)

    def ag(group):
        outs = [torch.zeros(2, 3) for _ in range(n)]
        dist.all_gather(outs, torch.full((2, 3), float(r)), group=group)
        return torch.stack(outs)

    def agt(group):
        o = torch.zeros(2 * n, 3)
        dist.all_gather_into_tensor(o, torch.full((2, 3), float(r) + 0.5), group=group)
        return o

    def rs(group):
        o = torch.zeros(4)
        dist.reduce_scatter(o, [torch.arange(4.0) * (i + 1) + r for i in range(n)], group=group)
        return o

    def rst(group):
        o = torch.zeros(3, dtype=torch.int64)
        dist.reduce_scatter_tensor(o, torch.arange(3 * n) * (r + 1), group=group)
        return o

    def a2a_single(group):  # uneven: rank r sends i + 1 rows to rank i
        send = torch.arange(sum(i + 1 for i in range(n)), dtype=torch.float32) + 100 * r
        o = torch.zeros(n * (r + 1))
        dist.all_to_all_single(o, send, [r + 1] * n, [i + 1 for i in range(n)], group=group)
        return o

    def a2a(group):
        o = [torch.zeros(2) for _ in range(n)]  # gloo's list form takes even sizes only
        dist.all_to_all(o, [torch.full((2,), float(10 * r + i)) for i in range(n)], group=group)
        return torch.cat(o)

    def bc(group):
        t = torch.full((4,), float(r))
        dist.broadcast(t, src=n - 1, group=group)
        return t

    def reduce(group):
        t = torch.full((3,), float(r + 1))
        dist.reduce(t, dst=0, group=group)
        return t if r == 0 else torch.zeros(0)

    def gather(group):
        lst = [torch.zeros(2) for _ in range(n)] if r == 1 else None
        dist.gather(torch.full((2,), float(r)), lst, dst=1, group=group)
        return torch.stack(lst) if lst else torch.zeros(0)

    def scatter(group):
        o = torch.zeros(3)
        dist.scatter(
            o, [torch.full((3,), float(i * 7)) for i in range(n)] if r == 0 else None, src=0, group=group
        )
        return o

    for name, fn in dict(ag=ag, agt=agt, rs=rs, rst=rst, a2a_single=a2a_single, a2a=a2a, bc=bc).items():
        mine, theirs = both(fn)
        out[name] = torch.equal(mine, theirs)
    for name, fn in dict(reduce=reduce, gather=gather, scatter=scatter).items():
        mine, theirs = both(fn)
        out[name] = torch.equal(mine, theirs)
    return out


def _object_and_p2p_cases(r, n):
    out = {}
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "sq": r * r})
    out["all_gather_object"] = objs == [{"rank": i, "sq": i * i} for i in range(n)]
    lst = [("hello", r)] if r == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    out["broadcast_object_list"] = lst == [("hello", 0)]
    got = [None]
    dist.scatter_object_list(got, [i * 3 for i in range(n)] if r == 0 else None, src=0)
    out["scatter_object_list"] = got == [r * 3]
    right, left = (r + 1) % n, (r - 1) % n
    recv_a, recv_b = torch.zeros(3), torch.zeros(3)
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.irecv, recv_b, left, tag=2),
            dist.P2POp(dist.irecv, recv_a, left, tag=1),
            dist.P2POp(dist.isend, torch.full((3,), float(r)), right, tag=1),
            dist.P2POp(dist.isend, torch.full((3,), float(r) + 0.5), right, tag=2),
        ]
    )
    for req in reqs:
        req.wait()
    out["batch_isend_irecv"] = recv_a.tolist() == [float(left)] * 3 and recv_b.tolist() == [left + 0.5] * 3
    if r == 0:
        dist.send(torch.arange(4.0), dst=n - 1, tag=9)
    elif r == n - 1:
        t = torch.zeros(4)
        dist.recv(t, src=0, tag=9)
        out["send_recv"] = t.tolist() == [0.0, 1.0, 2.0, 3.0]
    dist.barrier()
    return out


def collectives_vs_gloo():
    """Every collective on the hvdlite default group against the same call on a gloo group."""
    r, n = start()
    try:
        gloo = dist.new_group(backend="gloo")
        out = {"backend": dist.get_backend()}
        out.update(_allreduce_cases(r, n, gloo))
        out.update(_gather_scatter_cases(r, n, gloo))
        out.update(_object_and_p2p_cases(r, n))
        # Every call above completed: the group keeps no reference to a finished call's tensors.
        out["nothing_retained"] = len(dist.distributed_c10d._get_default_group()._in_flight) == 0
        return out
    finally:
        dist.destroy_process_group()


def subgroups():
    """new_group, split_group and a 2-D DeviceMesh become process sets among their members."""
    r, n = start()
    try:
        out = {}
        evens = dist.new_group([i for i in range(n) if i % 2 == 0])
        odds = dist.new_group([i for i in range(n) if i % 2 == 1])
        mine = evens if r % 2 == 0 else odds
        x = torch.tensor([float(r)])
        dist.all_reduce(x, group=mine)
        out["parity"] = x.item() == sum(i for i in range(n) if i % 2 == r % 2)
        pair = dist.new_group([0, 1])
        if r < 2:
            y = torch.tensor([r + 1.0])
            dist.all_reduce(y, group=pair)
            t = torch.zeros(2)
            dist.all_gather_into_tensor(t, torch.tensor([float(r)]), group=pair)
            out["pair"] = (y.item(), t.tolist())
        # torch 2.13's split_group needs an accelerator (it refuses gloo on CPU alike); a
        # DeviceMesh on CPU makes its groups with new_group.
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (n // 2, 2) if n % 2 == 0 else (n, 1), mesh_dim_names=("dp", "tp"))
        for dim in ("dp", "tp"):
            z = torch.tensor([float(r)])
            dist.all_reduce(z, group=mesh.get_group(dim))
            out[dim] = z.item()
        return out
    finally:
        dist.destroy_process_group()


def mismatch_then_usable():
    """Rank 0 reduces 4 elements where rank 1 reduces 5: both raise naming the ranks; the group
    then still works."""
    r, _n = start()
    try:
        out = {}
        try:
            dist.all_reduce(torch.ones(4 + r))
            out["raised"] = None
        except RuntimeError as e:
            out["raised"] = str(e)
        x = torch.ones(2)
        dist.all_reduce(x)
        out["after"] = x.tolist()
        return out
    finally:
        dist.destroy_process_group()


def dead_peer(dying_rank):
    """A rank that exits mid-job: the survivors' pending all_reduce raises, not hangs."""
    import time

    r, n = start()
    dist.new_group([i for i in range(n) if i != dying_rank])
    dist.all_reduce(torch.ones(1))
    if r == dying_rank:
        os._exit(3)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1024))
        return ("completed", time.monotonic() - t0)
    except RuntimeError as e:
        return (str(e)[:400], time.monotonic() - t0)
    finally:  # the failed runtime cannot remove the survivors' subgroup: torch's teardown completes
        dist.destroy_process_group()
        assert not dist.is_initialized()


def frozen_peer(victim, tmp):
    """A rank stopped by SIGSTOP (its sockets stay open): every survivor's pending all_reduce
    raises, naming it, within the core's liveness bound; then a survivor resumes it."""
    import signal
    import time

    r, n = start()
    pids = [None] * n
    dist.all_gather_object(pids, os.getpid())
    dist.all_reduce(torch.ones(4))
    if r == victim:
        os.kill(os.getpid(), signal.SIGSTOP)
        try:
            dist.all_reduce(torch.ones(4))
            return ("resumed", "completed")
        except RuntimeError as e:
            return ("resumed", str(e)[:200])
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        result = ("completed", time.monotonic() - t0)
    except RuntimeError as e:
        result = (str(e)[:400], time.monotonic() - t0)
    open(os.path.join(tmp, "failed.%d" % r), "w").close()
    if r == (victim + 1) % n:
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp)) < n - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pids[victim], signal.SIGCONT)
    return result


def output_into_caller_buffer():
    """The core writes an allgather's result into the caller's buffer (what the backend does for
    all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single); one too small for the
    result fails the operation, naming both sizes (last: that failure ends the job)."""
    import numpy as np

    import hvdlite as hvd
    from hvdlite.common import collectives, numpy_buffers, ops

    hvd.init()
    r = hvd.rank()
    out = np.full(4, -1.0, np.float32)
    pending = collectives.with_output(
        numpy_buffers.NUMPY, "allgather", ops.ALLGATHER, np.full(2, float(r), np.float32), "into", out=out
    )
    ops.wait(pending.core)
    result, _ = pending.finish()
    # An output the core cannot write as it is (strided) goes through a copy written back; one of
    # another dtype is refused before anything is submitted (on every rank alike: no hang).
    spaced = np.full(8, -1.0, np.float32)
    pending = collectives.with_output(
        numpy_buffers.NUMPY,
        "allgather",
        ops.ALLGATHER,
        np.full(2, r + 5.0, np.float32),
        "spaced",
        out=spaced[::2],
    )
    ops.wait(pending.core)
    pending.finish()
    try:
        collectives.with_output(
            numpy_buffers.NUMPY, "allgather", ops.ALLGATHER, np.ones(2, np.float32), "f64", out=np.zeros(4)
        )
        refused = None
    except hvd.HvdliteError as e:
        refused = str(e)
    small = np.zeros(3, np.float32)
    pending = collectives.with_output(
        numpy_buffers.NUMPY, "allgather", ops.ALLGATHER, np.ones(2, np.float32), "small", out=small
    )
    try:
        ops.wait(pending.core)
        error = None
    except hvd.HvdliteError as e:
        error = str(e)
    return result is out, out.tolist(), error, spaced.tolist(), refused


def init_method_tcp(port):
    """init_process_group with init_method, rank and world_size and no launcher variables: the
    hvdlite job forms through torch's own store."""
    r = int(os.environ["CASE_RANK"])
    rank, _n = start(init_method="tcp://127.0.0.1:%d" % port, rank=r, world_size=2)
    import hvdlite.torch as hvd

    x = torch.tensor([rank + 1.0])
    dist.all_reduce(x)
    y = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum)  # hvd.* in the same job, one runtime
    dist.destroy_process_group()
    return (rank, hvd.rank(), x.item(), y.item())


def timeouts():
    """The group's timeout bounds a blocking call, and Work.wait(timeout) its own wait; the call
    itself keeps running and completes once the late rank joins it."""
    import time

    r, _n = start(timeout=timedelta(seconds=2))
    try:
        out = {}
        x = torch.ones(3)
        if r == 1:
            time.sleep(3)  # past rank 0's 2 s bound, and within the bound of its barrier after
        t0 = time.monotonic()
        try:
            dist.all_reduce(x)
            out["group"] = ("completed", round(time.monotonic() - t0))
        except TimeoutError as e:
            out["group"] = ("timeout", round(time.monotonic() - t0), "2.000 s" in str(e))
        dist.barrier()  # rank 0's all_reduce completed meanwhile: the group goes on
        if r == 1:
            time.sleep(1.5)
        work = dist.all_reduce(torch.ones(2), async_op=True)
        try:
            work.wait(timeout=timedelta(seconds=0.3))
            out["wait"] = "completed"
        except TimeoutError:
            out["wait"] = "timeout"
        work.wait()
        out["after"] = (x.tolist(), work.result()[0].tolist())
        return out
    finally:
        dist.destroy_process_group()


def group_lifetime(rounds):
    """A subgroup of ranks 1 and 2 created, used and destroyed `rounds` times: its process set is
    removed among its members each time (rank 0 takes no part), so the core's tables stay small;
    collectives on the world and on fresh subgroups work after; destroying the world removes the
    subgroups' sets, and init_process_group("hvdlite") again in this process works."""
    from hvdlite.common import process_sets

    r, _n = start()
    out = {"sums": True, "ids": set(), "peak": 0}
    try:
        for i in range(rounds):
            g = dist.new_group([1, 2])
            if r in (1, 2):
                x = torch.tensor([float(r + i)])
                dist.all_reduce(x, group=g)
                out["sums"] &= x.item() == 3.0 + 2 * i
                out["ids"].add(g._set_id)
                dist.destroy_process_group(g)
                if i == 0:
                    try:
                        g.allreduce([torch.ones(1)], dist.AllreduceOptions())
                        out["refused"] = None
                    except Exception as e:
                        out["refused"] = "%s: %s" % (type(e).__name__, e)
            out["peak"] = max(out["peak"], len(process_sets.core_set_ids()))
        x = torch.tensor([float(r)])
        dist.all_reduce(x)
        out["world"] = x.item()
        fresh = dist.new_group([0, 2])
        if r in (0, 2):
            y = torch.zeros(2)
            dist.all_gather_into_tensor(y, torch.tensor([float(r)]), group=fresh)
            out["fresh"] = y.tolist()
        kept = dist.new_group([1, 2])  # left to the world's destruction
        if r in (1, 2):
            z = torch.tensor([1.0])
            dist.all_reduce(z, group=kept)
            out["kept"] = z.item()
        try:
            dist.split_group(split_ranks=[[0, 1]])
            out["split"] = None
        except RuntimeError as e:  # torch 2.13 needs an accelerator (docs/torch_backend.md)
            out["split"] = str(e)
    finally:
        dist.destroy_process_group()
    out["after_world"] = process_sets.core_set_ids()
    out["registry"] = sorted(process_sets.ids_and_ranks())
    r2, n2 = start()  # again, in the same process: joins the same hvdlite runtime
    try:
        g = dist.new_group([0, 1])
        w = torch.tensor([float(r2)])
        if r2 < 2:
            dist.all_reduce(w, group=g)  # 0 + 1 on ranks 0 and 1
        dist.all_reduce(w)
        out["again"] = (r2, n2, w.item())
    finally:
        dist.destroy_process_group()
    out["after_again"] = process_sets.core_set_ids()
    out["ids"] = sorted(out["ids"])
    return out


def member_never_destroys():
    """Rank 1 destroys its subgroup with rank 2, which never does: rank 1's destroy fails after
    the stall bound, naming the set and rank 2; then every rank's world collectives still work.
    (Run in fresh processes: the half-destroyed subgroup stays on rank 2.)"""
    r, _n = start()
    store = dist.distributed_c10d._get_default_store()
    g = dist.new_group([1, 2])
    error = None
    if r == 1:
        try:
            dist.destroy_process_group(g)
        except Exception as e:  # the error the user sees
            error = "%s: %s" % (type(e).__name__, e)
        store.set("rank1_done", "1")
    else:
        store.wait(["rank1_done"])  # (not an hvdlite collective: nothing else stalls meanwhile)
    x = torch.tensor([1.0])
    dist.all_reduce(x)
    return error, x.item()


def groups_on_one_set():
    """The world and a new_group of every rank are one process set: calls of the same kind and
    signature in flight on both at once stay apart (each group names its own)."""
    _r, n = start()
    try:
        every = dist.new_group(list(range(n)))
        a, b = torch.ones(3), torch.full((3,), 2.0)
        works = [dist.all_reduce(a, async_op=True), dist.all_reduce(b, group=every, async_op=True)]
        for work in works:
            work.wait()
        return a.tolist(), b.tolist()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # under a launcher (tests/test_torch_backend.py runs it with torchrun)
    import json
    import sys

    result = collectives_vs_gloo()
    with open(os.path.join(sys.argv[1], "rank%d.json" % int(os.environ["RANK"])), "w") as f:
        json.dump(result, f)
