"""Gradients of the differentiable collectives follow Horovod's definitions
(hvdlite/common/gradients.py); references are computed here from every
rank's upstream gradient. Also fp16 compression through allreduce."""

import pytest
import torch
from helpers import run_pooled
from torch_wire import from_wire, to_wire


def _upstream(shape, rank, salt):
    numel = 1
    for d in shape:
        numel *= d
    return ((torch.arange(numel, dtype=torch.float64) * (salt + 1) + 3 * rank) % 7 + 1).reshape(shape)


def _leaf(rows, rank):
    return (torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) + rank).requires_grad_()


def _backward(y, salt, rank):
    y.backward(_upstream(tuple(y.shape), rank, salt))


def _grads():
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {}
    for salt, op in enumerate(["Sum", "Average"]):
        x = _leaf(3, r)
        _backward(hvd.allreduce(x, op=getattr(hvd, op), prescale_factor=2.0), salt, r)
        out["allreduce." + op] = x.grad
    x = _leaf(r + 1, r)
    _backward(hvd.allgather(x), 2, r)
    out["allgather"] = x.grad
    x = _leaf(2, r)
    _backward(hvd.broadcast(x, root_rank=n - 1), 3, r)
    out["broadcast"] = x.grad
    splits = [(r + j) % 3 + 1 for j in range(n)]
    x = _leaf(sum(splits), r)
    y, received = hvd.alltoall(x, splits=splits)
    _backward(y, 4, r)
    out["alltoall"] = (x.grad, received)
    for salt, op in ((5, "Sum"), (6, "Average")):
        x = _leaf(2 * n, r)
        _backward(hvd.reducescatter(x, op=getattr(hvd, op)), salt, r)
        out["reducescatter." + op] = x.grad
    a, b = _leaf(2, r), _leaf(1, r)
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    (ya * _upstream((2, 2), r, 7)).sum().add((yb * _upstream((1, 2), r, 8)).sum()).backward()
    out["grouped_allreduce"] = (a.grad, b.grad)
    a, b = _leaf(r + 1, r), _leaf(1, r)
    ga, gb = hvd.grouped_allgather([a, b])
    (ga * _upstream(tuple(ga.shape), r, 9)).sum().add(
        (gb * _upstream(tuple(gb.shape), r, 10)).sum()
    ).backward()
    out["grouped_allgather"] = (a.grad, b.grad)
    x = torch.full((3,), 1.0 + r, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    y.backward(torch.ones(3))
    wire, ctx = hvd.Compression.fp16.compress(torch.ones(2, dtype=torch.float64))
    out["fp16"] = (
        y,
        x.grad,
        str(wire.dtype),
        str(hvd.Compression.fp16.decompress(wire, ctx).dtype),
        str(hvd.Compression.fp16.compress(torch.ones(2, dtype=torch.int32))[0].dtype),
    )
    hvd.shutdown()
    return to_wire(out)


def _segments(rows_per_rank):
    starts = [sum(rows_per_rank[:i]) for i in range(len(rows_per_rank))]
    return [(s, c) for s, c in zip(starts, rows_per_rank)]


def _check_reductions(results, n):
    ups = lambda shape, salt: [_upstream(shape, k, salt) for k in range(n)]  # noqa: E731
    for r, res in enumerate(results):
        assert torch.equal(res["allreduce.Sum"], sum(ups((3, 2), 0)) * 2.0)
        assert torch.allclose(res["allreduce.Average"], sum(ups((3, 2), 1)) / n * 2.0)
        total = sum(k + 1 for k in range(n))
        start, rows = _segments([k + 1 for k in range(n)])[r]
        assert torch.allclose(res["allgather"], (sum(ups((total, 2), 2)) / n)[start : start + rows])
        want = sum(ups((2, 2), 3)) / n if r == n - 1 else torch.zeros(2, 2, dtype=torch.float64)
        assert torch.allclose(res["broadcast"], want)
        for op, salt, scale in (("Sum", 5, n), ("Average", 6, 1)):
            gathered = torch.cat([_upstream((2, 2), k, salt) for k in range(n)])
            assert torch.allclose(res["reducescatter." + op], gathered * scale), op
        a, b = res["grouped_allreduce"]
        assert torch.equal(a, sum(ups((2, 2), 7))) and torch.equal(b, sum(ups((1, 2), 8)))
        a, b = res["grouped_allgather"]
        assert torch.allclose(a, (sum(ups((total, 2), 9)) / n)[start : start + rows])
        assert torch.allclose(b, (sum(ups((n, 2), 10)) / n)[r : r + 1])


def _check_alltoall(results, n):
    splits = [[(r + j) % 3 + 1 for j in range(n)] for r in range(n)]  # splits[sender][receiver]
    for r, res in enumerate(results):
        grad, received = res["alltoall"]
        assert received.tolist() == [splits[k][r] for k in range(n)]
        parts = []
        for j in range(n):  # what r sent to j comes back from j's upstream
            got_rows = [splits[k][j] for k in range(n)]
            start = sum(got_rows[:r])
            parts.append(_upstream((sum(got_rows), 2), j, 4)[start : start + splits[r][j]])
        assert torch.equal(grad, torch.cat(parts))


@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_gradients_of_every_collective(size):
    results = from_wire(run_pooled(_grads, size, timeout=120))
    _check_reductions(results, size)
    _check_alltoall(results, size)
    for _r, res in enumerate(results):
        y, grad, wire, restored, ints = res["fp16"]
        assert y.dtype == torch.float32 and torch.equal(y, torch.full((3,), float(sum(range(1, size + 1)))))
        assert grad.dtype == torch.float32 and torch.equal(grad, torch.full((3,), float(size)))
        assert (wire, restored, ints) == ("torch.float16", "torch.float64", "torch.int32")
