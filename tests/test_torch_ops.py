"""hvdlite.torch collectives on 1-4 real processes: every op x dtype x shape
against a reference computed here, bitwise-identical results across ranks,
async / in-place / grouped forms, non-contiguous tensors and process sets."""

import numpy as np
import pytest
import torch
from helpers import run_pooled
from torch_wire import NUMERIC_DTYPES, from_wire, to_wire

DTYPES = NUMERIC_DTYPES
OPS = ["Sum", "Average", "Min", "Max", "Product"]
SHAPES = [(0,), (1,), (7,), (3, 5), (2, 3, 4)]


def _values(dtype, op, shape, rank):
    """Small integers, so every reduction is exact in every dtype."""
    idx = torch.arange(int(np.prod(shape)), dtype=torch.int64).reshape(shape)
    raw = (idx + rank) % 2 + 1 if op == "Product" else (idx * 3 + rank * 5) % 9
    return raw.to(dtype)


def _reference(dtype, op, shape, size):
    stack = torch.stack([_values(dtype, op, shape, r).to(torch.float64) for r in range(size)])
    if op in ("Sum", "Average"):
        out = stack.sum(0)
        if op == "Average":
            out = out / size
            if not dtype.is_floating_point:
                out = torch.trunc(out)
    elif op == "Product":
        out = stack.prod(0)
    else:
        out = stack.amin(0) if op == "Min" else stack.amax(0)
    return out.to(dtype)


def _bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _allreduce_matrix(hvd):
    out = {}
    for dtype in DTYPES:
        for op in OPS:
            for shape in SHAPES:
                x = _values(dtype, op, shape, hvd.rank())
                key = (str(dtype), op, shape)
                y = hvd.allreduce(x, op=getattr(hvd, op), name="ar.%s.%s.%s" % key)
                assert y.dtype == dtype and tuple(y.shape) == shape
                out[key] = y
    return out


@pytest.mark.parametrize("size", [1, 2, pytest.param(3, marks=pytest.mark.slow), 4])
def test_every_collective_dtype_op_and_shape(size):
    results = from_wire(run_pooled(_all_collectives, size, timeout=240))
    _check_allreduce([r["allreduce"] for r in results], size)
    _check_other([r["other"] for r in results], size)
    if size == 4:
        _check_process_sets([r["process_sets"] for r in results])


def _check_allreduce(results, size):
    for key, got in results[0].items():
        assert all(_bytes(r[key]) == _bytes(got) for r in results), "ranks disagree on %s" % (key,)
        dtype = next(d for d in DTYPES if str(d) == key[0])
        assert torch.equal(got, _reference(dtype, key[1], key[2], size)), key


def _other_collectives(hvd):
    r, n = hvd.rank(), hvd.size()
    out = {}
    for dtype in DTYPES + [torch.bool]:
        rows = 0 if r == 1 else r + 2
        x = ((torch.arange(rows * 3).reshape(rows, 3) + 10 * r) % 7).to(dtype)
        out[("allgather", str(dtype))] = hvd.allgather(x, name="ag.%s" % dtype)
        for root in range(n):
            y = ((torch.arange(11) + root * 3 + r) % 5).to(dtype)
            out[("broadcast", str(dtype), root)] = hvd.broadcast(y, root, name="bc.%s.%d" % (dtype, root))
        even = (
            (torch.arange(2 * n * 3).reshape(2 * n, 3) + 100 * r).to(dtype)
            if dtype != torch.bool
            else torch.ones(2 * n, 3, dtype=torch.bool)
        )
        out[("alltoall", str(dtype))] = hvd.alltoall(even, name="a2a.%s" % dtype)
        if dtype != torch.bool:
            rs = torch.full((2 * n + 1, 2), r + 1).to(dtype)
            out[("reducescatter", str(dtype))] = hvd.reducescatter(rs, op=hvd.Sum, name="rs.%s" % dtype)
    splits = [(r + j) % 3 for j in range(n)]
    x = torch.repeat_interleave(torch.arange(n) * 100 + r, torch.tensor(splits)).reshape(-1, 1).float()
    out["alltoall_splits"] = hvd.alltoall(x, splits=torch.tensor(splits), name="a2a.splits")
    out["rs_avg"] = hvd.reducescatter(torch.full((n * 2, 3), float(r + 1)), name="rs.avg")
    out["scaled"] = hvd.allreduce(torch.ones(4), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    return out


def _all_collectives():
    """One job per world size runs every part (process start-up dominates)."""
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    out = {"allreduce": _allreduce_matrix(hvd), "other": _other_collectives(hvd)}
    if hvd.size() == 4:
        out["process_sets"] = _process_sets(hvd)
    hvd.shutdown()
    return to_wire(out)


def _check_other(results, size):
    n = size
    for dtype in DTYPES + [torch.bool]:
        parts = [
            ((torch.arange((0 if r == 1 else r + 2) * 3).reshape(-1, 3) + 10 * r) % 7).to(dtype)
            for r in range(n)
        ]
        for res in results:
            assert torch.equal(res[("allgather", str(dtype))], torch.cat(parts))
            for root in range(n):
                assert torch.equal(
                    res[("broadcast", str(dtype), root)], ((torch.arange(11) + root * 4) % 5).to(dtype)
                )
    for r, res in enumerate(results):
        for dtype in DTYPES:
            got = res[("alltoall", str(dtype))]
            want = torch.cat(
                [(torch.arange(2 * n * 3).reshape(2 * n, 3)[2 * r : 2 * r + 2] + 100 * k) for k in range(n)]
            ).to(dtype)
            assert torch.equal(got, want), dtype
            rows = (2 * n + 1) // n + (1 if r < (2 * n + 1) % n else 0)
            assert torch.equal(
                res[("reducescatter", str(dtype))], torch.full((rows, 2), n * (n + 1) // 2).to(dtype)
            )
        out, received = res["alltoall_splits"]
        want_rows = [(j + r) % 3 for j in range(n)]
        assert received.dtype == torch.int32 and received.tolist() == want_rows
        assert (
            out[:, 0].tolist()
            == torch.repeat_interleave(r * 100 + torch.arange(n), torch.tensor(want_rows)).float().tolist()
        )
        assert torch.allclose(res["rs_avg"], torch.full((2, 3), (n + 1) / 2.0))
        assert res["scaled"].tolist() == [float(n)] * 4


def _async_inplace_grouped():
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    out = {}
    tensors = [torch.full((100,), float(r + i)) for i in range(10)]
    pointers = [t.data_ptr() for t in tensors]
    handles = [hvd.allreduce_async_(t, op=hvd.Sum, name="async.%d" % i) for i, t in enumerate(tensors)]
    out["polled_bool"] = all(isinstance(hvd.poll(h), bool) for h in handles)
    results = [hvd.synchronize(h) for h in handles]
    out["same_objects"] = all(a is b for a, b in zip(results, tensors))
    out["same_pointers"] = [t.data_ptr() for t in tensors] == pointers
    out["firsts"] = [t[0].item() for t in tensors]
    base = torch.zeros(4, 6, dtype=torch.float64)
    base[:, ::2] = r + 1
    hvd.allreduce_(base[:, ::2], op=hvd.Sum)  # non-contiguous view, written back
    out["strided"] = base
    transposed = torch.arange(6.0).reshape(2, 3).t()
    out["transposed"] = hvd.allreduce(transposed, op=hvd.Sum)
    source = torch.ones(3)
    copy = hvd.synchronize(hvd.allreduce_async(source, op=hvd.Sum))
    out["out_of_place"] = (source.tolist(), copy.tolist())
    h = hvd.grouped_allreduce_async([torch.ones(2) * r, torch.ones(3, dtype=torch.int32)], op=hvd.Sum)
    out["grouped_async"] = [t.tolist() for t in hvd.synchronize(h)]
    in_place = [torch.ones(2), torch.full((2,), 2.0)]
    out["grouped_inplace_same"] = all(
        a is b for a, b in zip(hvd.grouped_allreduce_(in_place, op=hvd.Max), in_place)
    )
    out["grouped_allgather"] = [
        t.tolist() for t in hvd.grouped_allgather([torch.tensor([r]), torch.tensor([[r, r]])])
    ]
    out["grouped_rs"] = [
        t.tolist() for t in hvd.grouped_reducescatter([torch.ones(4, 1), torch.ones(2)], op=hvd.Sum)
    ]
    t = torch.full((3,), float(r))
    hvd.broadcast_(t, root_rank=hvd.size() - 1)
    out["broadcast_"] = t.tolist()
    out["broadcast_async"] = hvd.synchronize(hvd.broadcast_async(torch.tensor([r]), 0)).tolist()
    out["allgather_async"] = hvd.synchronize(hvd.allgather_async(torch.tensor([r]))).tolist()
    out["alltoall_async"] = [
        x.tolist() for x in hvd.synchronize(hvd.alltoall_async(torch.arange(hvd.size())))
    ]
    out["rs_async"] = hvd.synchronize(hvd.reducescatter_async(torch.ones(hvd.size()), op=hvd.Sum)).tolist()
    out["staged"] = _host_staged(hvd)
    hvd.barrier()
    hvd.shutdown()
    return to_wire(out)


def _host_staged(hvd):
    """The path CUDA tensors take for allgather / alltoall / reducescatter / Adasum
    (a host copy), forced here on CPU tensors: same results as the direct path."""
    from hvdlite.torch import buffers

    r, _n = hvd.rank(), hvd.size()
    x = torch.arange(4.0).reshape(2, 2) + r
    direct = (
        hvd.allgather(x),
        hvd.alltoall(x),
        hvd.reducescatter(x, op=hvd.Sum),
        hvd.allreduce(x, op=hvd.Adasum),
    )
    buffers.TORCH.stage_on_host = lambda t: True
    try:
        staged = (
            hvd.allgather(x),
            hvd.alltoall(x),
            hvd.reducescatter(x, op=hvd.Sum),
            hvd.allreduce(x, op=hvd.Adasum),
        )
    finally:
        del buffers.TORCH.stage_on_host
    return [torch.equal(a, b) for a, b in zip(direct, staged)]


def test_async_inplace_grouped_and_noncontiguous():
    results = from_wire(run_pooled(_async_inplace_grouped, 2, timeout=90))
    for r, res in enumerate(results):
        assert res["polled_bool"] and res["same_objects"] and res["same_pointers"]
        assert res["firsts"] == [1.0 + 2 * i for i in range(10)]
        assert torch.equal(res["strided"][:, ::2], torch.full((4, 3), 3.0, dtype=torch.float64))
        assert torch.equal(res["strided"][:, 1::2], torch.zeros(4, 3, dtype=torch.float64))
        assert torch.equal(res["transposed"], torch.arange(6.0).reshape(2, 3).t() * 2)
        assert res["out_of_place"] == ([1.0] * 3, [2.0] * 3)
        assert res["grouped_async"] == [[1.0, 1.0], [2, 2, 2]]
        assert res["grouped_inplace_same"]
        assert res["grouped_allgather"] == [[0, 1], [[0, 0], [1, 1]]]
        assert res["grouped_rs"] == [[[2.0], [2.0]], [2.0]]
        assert res["broadcast_"] == [1.0] * 3 and res["broadcast_async"] == [0]
        assert res["allgather_async"] == [0, 1]
        assert res["alltoall_async"] == [[r, r], [1, 1]]
        assert res["rs_async"] == [2.0]
        assert res["staged"] == [True] * 4


def _process_sets(hvd):
    r = hvd.rank()
    evens = hvd.add_process_set([0, 2])
    odds = hvd.add_process_set(hvd.ProcessSet([1, 3]))
    mine = evens if r % 2 == 0 else odds
    out = {
        "sum": hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=mine).item(),
        "gather": hvd.allgather(torch.tensor([r]), process_set=mine).tolist(),
        "bcast": hvd.broadcast(torch.tensor([r]), root_rank=mine.ranks[-1], process_set=mine).item(),
        "rs": hvd.reducescatter(torch.ones(2, 1), op=hvd.Sum, process_set=mine).tolist(),
        "global": hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item(),
    }
    x = torch.ones(2, requires_grad=True)
    hvd.allgather(x, process_set=mine).sum().backward()
    out["grad"] = x.grad.tolist()
    hvd.barrier(process_set=mine)
    hvd.remove_process_set(evens)
    hvd.remove_process_set(odds)
    return out


def _check_process_sets(results):
    for r, res in enumerate(results):
        members = [0, 2] if r % 2 == 0 else [1, 3]
        assert res["sum"] == float(sum(members)) and res["gather"] == members
        assert res["bcast"] == members[-1] and res["rs"] == [[2.0]] and res["global"] == 4.0
        assert res["grad"] == [1.0, 1.0]
