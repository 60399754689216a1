"""hvdlite.torch's collectives against Horovod 0.28.1 (see test_parity_torch.py): every
dtype Horovod carries, return types, in-place forms, handles, errors and gradients."""

import torch
from parity_torch import by_rank, covers, err, job_fixture
from torch_wire import NUMERIC_DTYPES

job = job_fixture(__name__)

# ---- allreduce ----------------------------------------------------------------------


def _ramp(dtype, rank, n=6):
    return (torch.arange(n) % 5 + rank + 1).to(dtype)


@covers("allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "poll", "synchronize")
class TestAllreduce:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        out = {"dtypes": {}}
        for dtype in NUMERIC_DTYPES:
            x = _ramp(dtype, r)
            out["dtypes"][str(dtype)] = (hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x))  # default: Average
        x = torch.full((3,), float(r + 1))
        y = hvd.allreduce(x, average=False, name="parity.ar.sum")
        out["new_tensor"] = (y is not x, x.tolist(), y.tolist())
        z = torch.full((3,), float(r + 1))
        same = hvd.allreduce_(z, op=hvd.Sum)
        out["in_place"] = (same is z, z.tolist())
        h = hvd.allreduce_async(torch.full((2,), float(r)), op=hvd.Max)
        out["handle"] = (type(h).__name__, isinstance(h, int))
        done = hvd.synchronize(h)
        hp = hvd.allreduce_async_(torch.ones(1), name="parity.poll")
        out["poll_after"] = type(hvd.poll(hp))
        hvd.synchronize(hp)
        out["async_max"] = done.tolist()
        w = torch.full((2,), float(r + 3))
        h2 = hvd.allreduce_async_(w, op=hvd.Min)
        out["async_in_place"] = (hvd.synchronize(h2) is w, w.tolist())
        out["op_and_average"] = err(lambda: hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum))
        out["average_kw"] = hvd.allreduce(torch.full((1,), float(r)), average=True).tolist()
        out["non_contiguous"] = hvd.allreduce(torch.arange(6.0).reshape(2, 3).t() * (r + 1), op=hvd.Sum)
        if r == 0:  # the first is in flight until rank 1 submits, after the barrier below
            h3 = hvd.allreduce_async(torch.ones(2), name="parity.dup")
            out["duplicate"] = err(lambda: hvd.allreduce_async(torch.ones(2), name="parity.dup"))
        hvd.barrier()
        if r == 1:
            h3 = hvd.allreduce_async(torch.ones(2), name="parity.dup")
        hvd.synchronize(h3)
        out["grad"] = _allreduce_grad(hvd, r)
        return out

    def test_every_dtype_sum_and_default_average(self, job):
        for res in by_rank(job, type(self)):
            for dtype in NUMERIC_DTYPES:
                total, avg = res["dtypes"][str(dtype)]
                want = (_ramp(torch.float64, 0) + _ramp(torch.float64, 1)).to(dtype)
                assert total.dtype == dtype and torch.equal(total, want), dtype
                # Average = Sum with postscale 1/size: integers truncate toward zero
                assert avg.dtype == dtype and torch.equal(avg, (want.double() * 0.5).to(dtype)), dtype

    def test_returns_new_tensor_and_keeps_input(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            assert res["new_tensor"] == (True, [float(r + 1)] * 3, [3.0] * 3)
            assert res["in_place"] == (True, [3.0] * 3)
            assert res["async_in_place"] == (True, [3.0, 3.0])
            assert res["async_max"] == [1.0, 1.0]
            assert res["average_kw"] == [0.5]
            assert torch.equal(res["non_contiguous"], torch.arange(6.0).reshape(2, 3).t() * 3)

    def test_handles_and_poll(self, job):
        for res in by_rank(job, type(self)):
            assert res["handle"][1], res["handle"]  # Horovod's handles are ints
            assert res["poll_after"] is bool

    def test_errors(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            # Horovod: ValueError('The op parameter supersedes average. Please provide only one of them.')
            assert "ValueError" in res["op_and_average"][1]
            if r == 0:  # Horovod's tests accept ValueError (or torch.FatalError)
                assert "ValueError" in res["duplicate"][1] and "parity.dup" in res["duplicate"][2]

    def test_gradient_is_an_allreduce(self, job):
        # backward of an op=Sum allreduce is an op=Sum allreduce of the upstream ones: 2,
        # times this rank's factor r + 1
        for r, res in enumerate(by_rank(job, type(self))):
            assert res["grad"] == [2.0 * (r + 1)] * 2


def _allreduce_grad(hvd, r):
    x = torch.ones(2, requires_grad=True)
    hvd.allreduce(x * (r + 1), op=hvd.Sum, name="parity.ar.grad").sum().backward()
    return x.grad.tolist()


@covers("grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_")
class TestGroupedAllreduce:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        xs = [torch.full((2,), float(r + 1)), torch.full((3, 2), r + 1, dtype=torch.int16)]
        out = {"grouped": hvd.grouped_allreduce(xs, op=hvd.Sum), "inputs": xs}
        ys = [torch.full((2,), float(r + 1)), torch.full((1,), float(r))]
        same = hvd.grouped_allreduce_(ys)  # default op: Average
        out["in_place"] = (all(a is b for a, b in zip(same, ys)), [y.tolist() for y in ys])
        h = hvd.grouped_allreduce_async([torch.ones(2)], op=hvd.Sum)
        out["async"] = [t.tolist() for t in hvd.synchronize(h)]
        zs = [torch.ones(1) * r]
        h = hvd.grouped_allreduce_async_(zs, op=hvd.Max)
        out["async_"] = (hvd.synchronize(h)[0] is zs[0], zs[0].tolist())
        return out

    def test_lists_in_lists_out(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            g = res["grouped"]
            assert isinstance(g, list) and [t.dtype for t in g] == [torch.float32, torch.int16]
            assert g[0].tolist() == [3.0, 3.0] and g[1].tolist() == [[3, 3]] * 3
            assert res["inputs"][0].tolist() == [float(r + 1)] * 2  # inputs unchanged
            assert res["in_place"] == (True, [[1.5, 1.5], [0.5]])
            assert res["async"] == [[2.0, 2.0]] and res["async_"] == (True, [1.0])


@covers("sparse_allreduce_async")
class TestSparseAllreduce:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        t = torch.sparse_coo_tensor(torch.tensor([[r]]), torch.tensor([float(r + 1)]), (3,))
        handle = hvd.sparse_allreduce_async(t, name="parity.sparse", op=hvd.Sum)
        return callable(handle), handle().to_dense().tolist()

    def test_callable_handle_gives_sum(self, job):
        # Horovod: the handle is a function (its optimizer calls handle()); the result is
        # the sparse sum of the gathered indices and values
        for res in by_rank(job, type(self)):
            assert res == (True, [1.0, 2.0, 0.0])


# ---- allgather, broadcast, alltoall, reducescatter -----------------------------------

ALL_DTYPES = NUMERIC_DTYPES + [torch.bool]


@covers("allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async")
class TestAllgather:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        out = {"dtypes": {}}
        for dtype in ALL_DTYPES:
            x = torch.full((r + 1, 2), r + 1).to(dtype)  # first dimension differs per rank
            out["dtypes"][str(dtype)] = hvd.allgather(x)
        out["async"] = hvd.synchronize(hvd.allgather_async(torch.tensor([r])))
        out["grouped"] = hvd.grouped_allgather([torch.tensor([r]), torch.full((1, 2), float(r))])
        out["grouped_async"] = hvd.synchronize(hvd.grouped_allgather_async([torch.tensor([r, r])]))
        out["scalar"] = err(lambda: hvd.allgather(torch.tensor(1.0), name="parity.ag.scalar"))
        out["dims"] = err(lambda: hvd.allgather(torch.ones(1, r + 1), name="parity.ag.dims"))
        out["type"] = err(
            lambda: hvd.allgather(
                torch.ones(1, dtype=torch.float32 if r else torch.int32), name="parity.ag.type"
            )
        )
        x = torch.ones(1, 3, requires_grad=True)
        hvd.allgather(x * (r + 1), name="parity.ag.grad").sum().backward()
        out["grad"] = x.grad.tolist()
        return out

    def test_every_dtype_concatenates_in_rank_order(self, job):
        for res in by_rank(job, type(self)):
            for dtype in ALL_DTYPES:
                got = res["dtypes"][str(dtype)]
                want = torch.cat([torch.full((k + 1, 2), k + 1).to(dtype) for k in range(2)])
                assert got.dtype == dtype and torch.equal(got, want), dtype
            assert res["async"].tolist() == [0, 1]
            assert isinstance(res["grouped"], list) and res["grouped"][0].tolist() == [0, 1]
            assert res["grouped"][1].tolist() == [[0.0, 0.0], [1.0, 1.0]]
            assert [t.tolist() for t in res["grouped_async"]] == [[0, 0, 1, 1]]

    def test_errors(self, job):
        for res in by_rank(job, type(self)):
            # Horovod's tests: (torch.FatalError, RuntimeError) for mismatched dims and types
            assert "RuntimeError" in res["dims"][1] and "RuntimeError" in res["type"][1]
            # Horovod: an error response "tried to allgather a rank-zero tensor"
            assert res["scalar"] is not None and "ValueError" in res["scalar"][1]

    def test_gradient(self, job):
        # allgather's gradient (Horovod: allreduce(grad, average=True), then this rank's
        # rows): the mean of the upstream ones is 1, times this rank's factor r + 1
        for r, res in enumerate(by_rank(job, type(self))):
            assert res["grad"] == [[1.0 * (r + 1)] * 3]


@covers("broadcast", "broadcast_", "broadcast_async", "broadcast_async_")
class TestBroadcast:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        out = {"dtypes": {}}
        for dtype in ALL_DTYPES:
            x = torch.full((2, 2), r + 1).to(dtype)
            y = hvd.broadcast(x, 1)
            out["dtypes"][str(dtype)] = (y, x)
        z = torch.full((3,), float(r))
        same = hvd.broadcast_(z, root_rank=1)
        out["in_place"] = (same is z, z.tolist())
        out["async"] = hvd.synchronize(hvd.broadcast_async(torch.tensor([r]), 0)).tolist()
        w = torch.tensor([float(r)])
        out["async_"] = (hvd.synchronize(hvd.broadcast_async_(w, 1)) is w, w.tolist())
        out["bad_root"] = err(lambda: hvd.broadcast(torch.ones(1), 5, name="parity.bc.root"))
        out["root_mismatch"] = err(lambda: hvd.broadcast(torch.ones(1), r, name="parity.bc.mismatch"))
        return out

    def test_every_dtype_new_tensor_from_root(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            for dtype in ALL_DTYPES:
                y, x = res["dtypes"][str(dtype)]
                assert y.dtype == dtype and torch.equal(y, torch.full((2, 2), 2).to(dtype)), dtype
                assert torch.equal(x, torch.full((2, 2), r + 1).to(dtype)), dtype  # input untouched
            assert res["in_place"] == (True, [1.0] * 3)
            assert res["async"] == [0] and res["async_"] == (True, [1.0])

    def test_errors(self, job):
        for res in by_rank(job, type(self)):
            assert res["bad_root"] is not None and "RuntimeError" in res["root_mismatch"][1]


@covers("alltoall", "alltoall_async")
class TestAlltoall:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        out = {"dtypes": {}}
        for dtype in ALL_DTYPES:
            x = (torch.arange(4).reshape(4, 1) + 10 * r).to(dtype)
            out["dtypes"][str(dtype)] = hvd.alltoall(x)  # no splits: only the tensor
        splits = (
            torch.tensor([1, 2], dtype=torch.int32) if r == 0 else torch.tensor([2, 1], dtype=torch.int32)
        )
        out["splits"] = hvd.alltoall(torch.arange(3.0) + 10 * r, splits)
        out["splits_list"] = hvd.alltoall(torch.arange(3.0) + 10 * r, splits.tolist())
        out["async"] = hvd.synchronize(hvd.alltoall_async(torch.arange(2) + 10 * r))
        out["uneven"] = err(lambda: hvd.alltoall(torch.empty(3), name="parity.a2a.uneven"))
        out["splits_sum"] = err(lambda: hvd.alltoall(torch.empty(1), torch.ones(2, dtype=torch.int32)))
        out["splits_type"] = err(lambda: hvd.alltoall(torch.empty(2), torch.ones(2)))
        return out

    def test_every_dtype(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            for dtype in ALL_DTYPES:
                got = res["dtypes"][str(dtype)]
                want = torch.cat(
                    [(torch.arange(4).reshape(4, 1) + 10 * k)[2 * r : 2 * r + 2] for k in range(2)]
                )
                assert isinstance(got, torch.Tensor) and torch.equal(got, want.to(dtype)), dtype

    def test_splits_give_tensor_and_received_splits(self, job):
        want = {0: ([0.0, 10.0, 11.0], [1, 2]), 1: ([1.0, 2.0, 12.0], [2, 1])}
        for r, res in enumerate(by_rank(job, type(self))):
            for key in ("splits", "splits_list"):
                out, received = res[key]
                assert out.tolist() == want[r][0] and received.tolist() == want[r][1], key
                assert received.dtype == torch.int32, key
            assert res["async"][0].tolist() == [r, 10 + r]  # async: (tensor, received splits)

    def test_errors_are_value_errors(self, job):
        # Horovod's test_horovod_alltoall_equal_split_length_error / splits_error /
        # splits_type_error: (torch.FatalError, ValueError)
        for res in by_rank(job, type(self)):
            for key in ("uneven", "splits_sum", "splits_type"):
                assert res[key] is not None and "ValueError" in res[key][1], (key, res[key])


@covers("reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async")
class TestReducescatter:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        out = {"dtypes": {}}
        for dtype in NUMERIC_DTYPES:
            x = (torch.arange(10).reshape(5, 2) % 7 + r).to(dtype)
            out["dtypes"][str(dtype)] = (hvd.reducescatter(x, op=hvd.Sum), hvd.reducescatter(x))
        out["async"] = hvd.synchronize(hvd.reducescatter_async(torch.full((2,), float(r + 1)), op=hvd.Sum))
        out["grouped"] = hvd.grouped_reducescatter([torch.full((2, 1), float(r + 1)), torch.ones(3)])
        h = hvd.grouped_reducescatter_async([torch.ones(4)], op=hvd.Sum)
        out["grouped_async"] = hvd.synchronize(h)
        out["scaled"] = hvd.reducescatter(
            torch.ones(2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25
        )
        out["scalar"] = err(lambda: hvd.reducescatter(torch.tensor(1.0), name="parity.rs.scalar"))
        return out

    def test_every_dtype_first_ranks_get_extra_rows(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            rows = slice(0, 3) if r == 0 else slice(3, 5)  # 5 rows over 2 ranks: 3 then 2
            for dtype in NUMERIC_DTYPES:
                total, avg = res["dtypes"][str(dtype)]
                full = sum((torch.arange(10).reshape(5, 2) % 7 + k).double() for k in range(2))
                assert total.dtype == dtype and torch.equal(total, full[rows].to(dtype)), dtype
                assert torch.equal(avg, (full[rows] * 0.5).to(dtype)), dtype  # default op: Average
            assert res["async"].tolist() == [3.0]
            assert [t.tolist() for t in res["grouped"]] == [[[1.5]], [1.0, 1.0] if r == 0 else [1.0]]
            assert [t.tolist() for t in res["grouped_async"]] == [[2.0, 2.0]]
            assert res["scaled"].tolist() == [1.0]

    def test_scalar_is_an_error(self, job):
        # Horovod's test: (torch.FatalError, RuntimeError, HorovodInternalError, ValueError)
        for res in by_rank(job, type(self)):
            assert res["scalar"] is not None and {"RuntimeError", "ValueError"} & set(res["scalar"][1])
