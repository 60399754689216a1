"""hvdlite.torch against Horovod 0.28.1's semantics, public name by public name.

Each ``Test*`` class below covers the horovod.torch names given to its ``@covers(...)``
decorator: dtypes, return types, exception types, defaults (checked against Horovod's
signatures, recorded here as facts read from its source at v0.28.1) and in-place behaviour.
The parts that need a job run once, on 2 real ranks (``job`` fixture: every class's
``on_rank`` in turn, the same calls on every rank); the tests then judge the results.

tests/data/horovod_0.28.1_api.json lists horovod.torch's public names; every one is either
covered by a class here or listed in NOT_YET_HERE with the reason (test_every_name_is_covered
checks both ways, so the list only shrinks).
"""

import inspect
import json
import os

import pytest
import torch
from helpers import run_ranks
from torch_wire import from_wire, to_wire

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "horovod_0.28.1_api.json")
with open(DATA) as _f:
    HOROVOD_TORCH_NAMES = json.load(_f)["modules"]["horovod.torch"]

# Names of horovod.torch this file does not cover yet, and why.
NOT_YET_HERE = {
    "check_extension": "horovod.common.util helper (build-time extension check); hvdlite lacks it",
    "elastic": "elastic training is not built yet (README, Status)",
}

# Horovod 0.28.1's signatures (parameter name, default; inspect.Parameter.empty = required),
# read from horovod/torch/mpi_ops.py, functions.py, optimizer.py and horovod/common/basics.py.
_E = inspect.Parameter.empty
_GPS = "global_process_set"
_ALLREDUCE = [("tensor", _E), ("average", None), ("name", None), ("op", None)]
_SCALES = [("prescale_factor", 1.0), ("postscale_factor", 1.0), ("process_set", _GPS)]
_RS_TAIL = [("op", "Average"), ("process_set", _GPS), ("prescale_factor", 1.0), ("postscale_factor", 1.0)]
HOROVOD_SIGNATURES = {
    "allreduce_async": _ALLREDUCE + _SCALES,
    "allreduce": _ALLREDUCE[:3] + [("compression", "Compression.none"), ("op", None)] + _SCALES,
    "allreduce_async_": _ALLREDUCE + _SCALES,
    "allreduce_": _ALLREDUCE + _SCALES,
    "grouped_allreduce_async": [("tensors", _E)] + _ALLREDUCE[1:] + _SCALES,
    "grouped_allreduce": [("tensors", _E)]
    + _ALLREDUCE[1:3]
    + [("compression", "Compression.none"), ("op", None)]
    + _SCALES,
    "grouped_allreduce_async_": [("tensors", _E)] + _ALLREDUCE[1:] + _SCALES,
    "grouped_allreduce_": [("tensors", _E)] + _ALLREDUCE[1:] + _SCALES,
    "sparse_allreduce_async": [("tensor", _E), ("name", _E), ("op", _E), ("process_set", _GPS)],
    "allgather_async": [("tensor", _E), ("name", None), ("process_set", _GPS)],
    "allgather": [("tensor", _E), ("name", None), ("process_set", _GPS)],
    "grouped_allgather_async": [("tensors", _E), ("name", None), ("process_set", _GPS)],
    "grouped_allgather": [("tensors", _E), ("name", None), ("process_set", _GPS)],
    "broadcast_async": [("tensor", _E), ("root_rank", _E), ("name", None), ("process_set", _GPS)],
    "broadcast": [("tensor", _E), ("root_rank", _E), ("name", None), ("process_set", _GPS)],
    "broadcast_async_": [("tensor", _E), ("root_rank", _E), ("name", None), ("process_set", _GPS)],
    "broadcast_": [("tensor", _E), ("root_rank", _E), ("name", None), ("process_set", _GPS)],
    "alltoall_async": [("tensor", _E), ("splits", None), ("name", None), ("process_set", _GPS)],
    "alltoall": [("tensor", _E), ("splits", None), ("name", None), ("process_set", _GPS)],
    "reducescatter_async": [("tensor", _E), ("name", None)] + _RS_TAIL,
    "reducescatter": [("tensor", _E), ("name", None), ("compression", "Compression.none")] + _RS_TAIL,
    "grouped_reducescatter_async": [("tensors", _E), ("name", None)] + _RS_TAIL,
    "grouped_reducescatter": [("tensors", _E), ("name", None), ("compression", "Compression.none")]
    + _RS_TAIL,
    "poll": [("handle", _E)],
    "synchronize": [("handle", _E)],
    "join": [("device", -1)],
    "barrier": [("process_set", _GPS)],
    "broadcast_parameters": [("params", _E), ("root_rank", _E)],
    "broadcast_optimizer_state": [("optimizer", _E), ("root_rank", _E), ("model", None)],
    "broadcast_object": [("obj", _E), ("root_rank", 0), ("name", None), ("process_set", _GPS)],
    "allgather_object": [("obj", _E), ("name", None)],
    "DistributedOptimizer": [
        ("optimizer", _E),
        ("named_parameters", None),
        ("compression", "Compression.none"),
        ("backward_passes_per_step", 1),
        ("op", "Average"),
        ("gradient_predivide_factor", 1.0),
        ("num_groups", 0),
        ("groups", None),
        ("sparse_as_dense", False),
        ("process_set", _GPS),
    ],
    "init": [("comm", None), ("process_sets", None)],
    "start_timeline": [("file_path", _E), ("mark_cycles", False)],
    "add_process_set": [("process_set", _E)],
    "remove_process_set": [("process_set", _E)],
}
for _n in [
    "shutdown",
    "is_initialized",
    "stop_timeline",
    "size",
    "local_size",
    "cross_size",
    "rank",
    "local_rank",
    "cross_rank",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
]:
    HOROVOD_SIGNATURES[_n] = []

# ---- registry -----------------------------------------------------------------------

COVERED = {}  # horovod.torch name -> the Test class covering it
RANK_PARTS = []  # Test classes with an on_rank(hvd) part, run in this order on every rank


def covers(*names):
    def register(cls):
        for name in names:
            assert name not in COVERED, "%s covered twice" % name
            COVERED[name] = cls
        cls.names = names
        if hasattr(cls, "on_rank"):
            RANK_PARTS.append(cls)
        return cls

    return register


def _err(fn):
    """None if fn() returns, else (class name, names of its classes in MRO order, message)."""
    try:
        fn()
        return None
    except BaseException as e:  # the point is to record what was raised
        return type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)


def _rank_main():
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    before_init = {cls.__name__: cls.before_init(hvd) for cls in RANK_PARTS if hasattr(cls, "before_init")}
    hvd.init()
    out = {"before_init": before_init, "rank": hvd.rank(), "size": hvd.size()}
    for cls in RANK_PARTS:
        out[cls.__name__] = cls.on_rank(hvd)
        hvd.barrier()
    hvd.shutdown()
    out["after_shutdown"] = {"is_initialized": hvd.is_initialized(), "rank": _err(hvd.rank)}
    return to_wire(out)


@pytest.fixture(scope="module")
def job():
    results = from_wire(run_ranks(_rank_main, 2, timeout=240))
    return results


def _by_rank(job, cls):
    return [r[cls.__name__] for r in job]


# ---- the name list ------------------------------------------------------------------


def test_every_name_is_covered_or_listed():
    missing = sorted(set(HOROVOD_TORCH_NAMES) - set(COVERED) - set(NOT_YET_HERE))
    assert not missing, "horovod.torch names neither covered here nor in NOT_YET_HERE: %s" % missing
    both = sorted(set(COVERED) & set(NOT_YET_HERE))
    assert not both, "covered now, remove from NOT_YET_HERE: %s" % both
    stray = sorted((set(COVERED) | set(NOT_YET_HERE)) - set(HOROVOD_TORCH_NAMES))
    assert not stray, "not horovod.torch names: %s" % stray


def test_not_yet_here_names_are_really_absent():
    import hvdlite.torch as hvd

    assert [n for n in NOT_YET_HERE if hasattr(hvd, n)] == []


@pytest.mark.parametrize("name", sorted(HOROVOD_SIGNATURES))
def test_signature_matches_horovod(name):
    """Parameter names, order and defaults as in Horovod (hvdlite may add trailing
    keyword parameters with defaults)."""
    import hvdlite.torch as hvd

    fn = getattr(hvd, name)
    params = list(inspect.signature(fn.__init__ if inspect.isclass(fn) else fn).parameters.values())
    if inspect.isclass(fn):
        params = params[1:]  # self
    want = HOROVOD_SIGNATURES[name]
    got = [(p.name, p.default) for p in params[: len(want)]]
    for (wname, wdefault), (gname, gdefault) in zip(want, got):
        assert gname == wname, (name, got, want)
        if wdefault == _GPS:
            assert gdefault is hvd.global_process_set, (name, gname)
        elif wdefault == "Compression.none":
            assert gdefault is hvd.Compression.none, (name, gname)
        elif wdefault == "Average":
            assert gdefault == hvd.Average and str(gdefault) == "Average", (name, gname)
        else:
            assert gdefault == wdefault and type(gdefault) is type(wdefault), (name, gname, gdefault)
    assert len(got) == len(want), (name, got, want)
    assert all(p.default is not _E or p.kind is p.VAR_POSITIONAL for p in params[len(want) :]), name


# ---- basics ---------------------------------------------------------------------------


@covers("init", "shutdown", "is_initialized")
class TestInitShutdown:
    @staticmethod
    def before_init(hvd):
        return {"is_initialized": hvd.is_initialized(), "rank": _err(hvd.rank), "size": _err(hvd.size)}

    @staticmethod
    def on_rank(hvd):
        hvd.init()  # a second init() while initialized is a no-op, as in Horovod
        return {"is_initialized": hvd.is_initialized(), "init_again_rank": hvd.rank()}

    def test_state_queries(self, job):
        for r, res in enumerate(job):
            assert res["before_init"]["TestInitShutdown"]["is_initialized"] is False
            assert res[type(self).__name__] == {"is_initialized": True, "init_again_rank": r}
            assert res["after_shutdown"]["is_initialized"] is False

    def test_not_initialized_is_a_value_error(self, job):
        # Horovod: ValueError('Horovod has not been initialized; use hvd.init().')
        for res in job:
            for err in (res["before_init"]["TestInitShutdown"]["rank"], res["after_shutdown"]["rank"]):
                assert err is not None and "ValueError" in err[1], err


@covers("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
class TestTopology:
    @staticmethod
    def on_rank(hvd):
        return {
            n: getattr(hvd, n)()
            for n in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
        }

    def test_ints_describing_one_host(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            assert all(type(v) is int for v in res.values()), res
            assert res == {
                "rank": r,
                "size": 2,
                "local_rank": r,
                "local_size": 2,
                "cross_rank": 0,
                "cross_size": 1,
            }


@covers(
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "gloo_built",
    "gloo_enabled",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
)
class TestCapabilities:
    @staticmethod
    def before_init(hvd):
        return {"gloo_enabled": hvd.gloo_enabled(), "mpi_enabled": hvd.mpi_enabled()}

    @staticmethod
    def on_rank(hvd):
        out = {
            n: getattr(hvd, n)()
            for n in ("mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built")
            + ("ddl_built", "ccl_built", "cuda_built", "rocm_built")
        }
        out["mpi_threads_supported"] = _err(hvd.mpi_threads_supported)
        return out

    def test_return_types_are_horovods(self, job):
        for res in _by_rank(job, type(self)):
            # Horovod: bools, except nccl_built(), which is NCCL_VERSION_CODE (an int; 0 without NCCL)
            for n in ("mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "ddl_built", "ccl_built"):
                assert type(res[n]) is bool, n
            assert type(res["cuda_built"]) is bool and type(res["rocm_built"]) is bool
            assert type(res["nccl_built"]) is int and res["nccl_built"] >= 0
            assert res["nccl_built"] == 0 or res["nccl_built"] >= 2000  # e.g. 23203 for NCCL 2.32.3
            assert res["ddl_built"] is False and res["ccl_built"] is False and res["rocm_built"] is False

    def test_job_without_mpi(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            assert res["gloo_built"] is True and res["gloo_enabled"] is True and res["mpi_enabled"] is False
            # Horovod: ValueError('Horovod MPI is not enabled ...') when the job does not use MPI
            assert "ValueError" in res["mpi_threads_supported"][1]
            assert job[r]["before_init"]["TestCapabilities"] == {"gloo_enabled": False, "mpi_enabled": False}


@covers("Sum", "Average", "Min", "Max", "Product", "Adasum")
class TestReduceOps:
    def test_distinct_named_ops(self):
        import hvdlite.torch as hvd

        ops = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product, hvd.Adasum]
        assert len(set(int(o) for o in ops)) == 6
        assert [str(o) for o in ops] == ["Sum", "Average", "Min", "Max", "Product", "Adasum"]


@covers("HorovodInternalError")
class TestHorovodInternalError:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        try:  # ranks disagree on the shape: the job reports it on both
            hvd.allreduce(torch.ones(r + 1), name="parity.mismatch")
            caught = None
        except hvd.HorovodInternalError as e:
            caught = (type(e).__name__, isinstance(e, RuntimeError), "parity.mismatch" in str(e))
        return caught

    def test_runtime_error_catches_failed_collectives(self):
        import hvdlite.torch as hvd

        assert issubclass(hvd.HorovodInternalError, RuntimeError)
        from hvdlite.common import exceptions

        assert hvd.HorovodInternalError is exceptions.HorovodInternalError

    def test_mismatch_is_catchable_as_horovod_internal_error(self, job):
        for res in _by_rank(job, type(self)):
            assert res == ("MismatchError", True, True)


# ---- allreduce ----------------------------------------------------------------------

# Horovod 0.28.1's dtypes (its test_torch.py's lists): every collective carries all of them;
# bool only moves (allgather, broadcast, alltoall), arithmetic needs the others.
NUMERIC_DTYPES = [
    torch.uint8,
    torch.int8,
    torch.uint16,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


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
        out["op_and_average"] = _err(lambda: hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum))
        out["average_kw"] = hvd.allreduce(torch.full((1,), float(r)), average=True).tolist()
        out["non_contiguous"] = hvd.allreduce(torch.arange(6.0).reshape(2, 3).t() * (r + 1), op=hvd.Sum)
        if r == 0:  # the first is in flight until rank 1 submits, after the barrier below
            h3 = hvd.allreduce_async(torch.ones(2), name="parity.dup")
            out["duplicate"] = _err(lambda: hvd.allreduce_async(torch.ones(2), name="parity.dup"))
        hvd.barrier()
        if r == 1:
            h3 = hvd.allreduce_async(torch.ones(2), name="parity.dup")
        hvd.synchronize(h3)
        out["grad"] = _allreduce_grad(hvd, r)
        return out

    def test_every_dtype_sum_and_default_average(self, job):
        for res in _by_rank(job, type(self)):
            for dtype in NUMERIC_DTYPES:
                total, avg = res["dtypes"][str(dtype)]
                want = (_ramp(torch.float64, 0) + _ramp(torch.float64, 1)).to(dtype)
                assert total.dtype == dtype and torch.equal(total, want), dtype
                # Average = Sum with postscale 1/size: integers truncate toward zero
                assert avg.dtype == dtype and torch.equal(avg, (want.double() * 0.5).to(dtype)), dtype

    def test_returns_new_tensor_and_keeps_input(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            assert res["new_tensor"] == (True, [float(r + 1)] * 3, [3.0] * 3)
            assert res["in_place"] == (True, [3.0] * 3)
            assert res["async_in_place"] == (True, [3.0, 3.0])
            assert res["async_max"] == [1.0, 1.0]
            assert res["average_kw"] == [0.5]
            assert torch.equal(res["non_contiguous"], torch.arange(6.0).reshape(2, 3).t() * 3)

    def test_handles_and_poll(self, job):
        for res in _by_rank(job, type(self)):
            assert res["handle"][1], res["handle"]  # Horovod's handles are ints
            assert res["poll_after"] is bool

    def test_errors(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            # Horovod: ValueError('The op parameter supersedes average. Please provide only one of them.')
            assert "ValueError" in res["op_and_average"][1]
            if r == 0:  # Horovod's tests accept ValueError (or torch.FatalError)
                assert "ValueError" in res["duplicate"][1] and "parity.dup" in res["duplicate"][2]

    def test_gradient_is_an_allreduce(self, job):
        # backward of an op=Sum allreduce is an op=Sum allreduce of the upstream ones: 2,
        # times this rank's factor r + 1
        for r, res in enumerate(_by_rank(job, type(self))):
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
        for r, res in enumerate(_by_rank(job, type(self))):
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
        for res in _by_rank(job, type(self)):
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
        out["scalar"] = _err(lambda: hvd.allgather(torch.tensor(1.0), name="parity.ag.scalar"))
        out["dims"] = _err(lambda: hvd.allgather(torch.ones(1, r + 1), name="parity.ag.dims"))
        out["type"] = _err(
            lambda: hvd.allgather(
                torch.ones(1, dtype=torch.float32 if r else torch.int32), name="parity.ag.type"
            )
        )
        x = torch.ones(1, 3, requires_grad=True)
        hvd.allgather(x * (r + 1), name="parity.ag.grad").sum().backward()
        out["grad"] = x.grad.tolist()
        return out

    def test_every_dtype_concatenates_in_rank_order(self, job):
        for res in _by_rank(job, type(self)):
            for dtype in ALL_DTYPES:
                got = res["dtypes"][str(dtype)]
                want = torch.cat([torch.full((k + 1, 2), k + 1).to(dtype) for k in range(2)])
                assert got.dtype == dtype and torch.equal(got, want), dtype
            assert res["async"].tolist() == [0, 1]
            assert isinstance(res["grouped"], list) and res["grouped"][0].tolist() == [0, 1]
            assert res["grouped"][1].tolist() == [[0.0, 0.0], [1.0, 1.0]]
            assert [t.tolist() for t in res["grouped_async"]] == [[0, 0, 1, 1]]

    def test_errors(self, job):
        for res in _by_rank(job, type(self)):
            # Horovod's tests: (torch.FatalError, RuntimeError) for mismatched dims and types
            assert "RuntimeError" in res["dims"][1] and "RuntimeError" in res["type"][1]
            # Horovod: an error response "tried to allgather a rank-zero tensor"
            assert res["scalar"] is not None and "ValueError" in res["scalar"][1]

    def test_gradient(self, job):
        # allgather's gradient (Horovod: allreduce(grad, average=True), then this rank's
        # rows): the mean of the upstream ones is 1, times this rank's factor r + 1
        for r, res in enumerate(_by_rank(job, type(self))):
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
        out["bad_root"] = _err(lambda: hvd.broadcast(torch.ones(1), 5, name="parity.bc.root"))
        out["root_mismatch"] = _err(lambda: hvd.broadcast(torch.ones(1), r, name="parity.bc.mismatch"))
        return out

    def test_every_dtype_new_tensor_from_root(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            for dtype in ALL_DTYPES:
                y, x = res["dtypes"][str(dtype)]
                assert y.dtype == dtype and torch.equal(y, torch.full((2, 2), 2).to(dtype)), dtype
                assert torch.equal(x, torch.full((2, 2), r + 1).to(dtype)), dtype  # input untouched
            assert res["in_place"] == (True, [1.0] * 3)
            assert res["async"] == [0] and res["async_"] == (True, [1.0])

    def test_errors(self, job):
        for res in _by_rank(job, type(self)):
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
        out["uneven"] = _err(lambda: hvd.alltoall(torch.empty(3), name="parity.a2a.uneven"))
        out["splits_sum"] = _err(lambda: hvd.alltoall(torch.empty(1), torch.ones(2, dtype=torch.int32)))
        out["splits_type"] = _err(lambda: hvd.alltoall(torch.empty(2), torch.ones(2)))
        return out

    def test_every_dtype(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            for dtype in ALL_DTYPES:
                got = res["dtypes"][str(dtype)]
                want = torch.cat(
                    [(torch.arange(4).reshape(4, 1) + 10 * k)[2 * r : 2 * r + 2] for k in range(2)]
                )
                assert isinstance(got, torch.Tensor) and torch.equal(got, want.to(dtype)), dtype

    def test_splits_give_tensor_and_received_splits(self, job):
        want = {0: ([0.0, 10.0, 11.0], [1, 2]), 1: ([1.0, 2.0, 12.0], [2, 1])}
        for r, res in enumerate(_by_rank(job, type(self))):
            for key in ("splits", "splits_list"):
                out, received = res[key]
                assert out.tolist() == want[r][0] and received.tolist() == want[r][1], key
                assert received.dtype == torch.int32, key
            assert res["async"][0].tolist() == [r, 10 + r]  # async: (tensor, received splits)

    def test_errors_are_value_errors(self, job):
        # Horovod's test_horovod_alltoall_equal_split_length_error / splits_error /
        # splits_type_error: (torch.FatalError, ValueError)
        for res in _by_rank(job, type(self)):
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
        out["scalar"] = _err(lambda: hvd.reducescatter(torch.tensor(1.0), name="parity.rs.scalar"))
        return out

    def test_every_dtype_first_ranks_get_extra_rows(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
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
        for res in _by_rank(job, type(self)):
            assert res["scalar"] is not None and {"RuntimeError", "ValueError"} & set(res["scalar"][1])


# ---- synchronisation, join, timeline --------------------------------------------------


@covers("barrier", "join")
class TestBarrierJoin:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        out = {"barrier": hvd.barrier()}
        lasts = []
        for first in range(2):
            if r == first:
                lasts.append(hvd.join())
            else:
                # Horovod: only allreduce runs with joined ranks (its test_horovod_join_allreduce,
                # join_allgather and join_broadcast)
                s = hvd.allreduce(torch.full((2,), float(r + 1)), op=hvd.Sum, name="parity.join.ar")
                e1 = _err(lambda: hvd.allgather(torch.ones(1), name="parity.join.ag"))
                e2 = _err(lambda: hvd.broadcast(torch.ones(1), r, name="parity.join.bc"))
                lasts.append(hvd.join())
                out["while_joined_%d" % first] = (s.tolist(), e1, e2)
        out["lasts"] = lasts
        return out

    def test_barrier_returns_none(self, job):
        assert all(res["barrier"] is None for res in _by_rank(job, type(self)))

    def test_join_returns_the_last_rank_everywhere(self, job):
        for res in _by_rank(job, type(self)):
            assert res["lasts"] == [1, 0] and all(type(v) is int for v in res["lasts"])

    def test_only_allreduce_runs_with_joined_ranks(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            s, e1, e2 = res["while_joined_%d" % (1 - r)]
            assert s == [float(r + 1)] * 2  # the joined rank adds zeros
            for err in (e1, e2):  # Horovod's tests: (torch.FatalError, RuntimeError)
                assert err is not None and "RuntimeError" in err[1] and "joined" in err[2], err


@covers("start_timeline", "stop_timeline")
class TestTimeline:
    @staticmethod
    def on_rank(hvd):
        import tempfile

        path = os.path.join(tempfile.mkdtemp(), "timeline.json")
        path = hvd.broadcast_object(path, 0, name="parity.tl.path")
        started = hvd.start_timeline(path, mark_cycles=False)
        hvd.allreduce(torch.ones(2), name="parity.tl.ar")
        stopped = hvd.stop_timeline()
        text = ""
        if hvd.rank() == 0:
            with open(path) as f:
                text = f.read()
        return started, stopped, "parity.tl.ar" in text

    def test_returns_none_and_rank0_writes(self, job):
        results = _by_rank(job, type(self))
        assert all(res[:2] == (None, None) for res in results)
        assert results[0][2] is True


# ---- process sets ---------------------------------------------------------------------


@covers("ProcessSet", "add_process_set", "remove_process_set", "global_process_set")
class TestProcessSets:
    @staticmethod
    def before_init(hvd):
        ps = hvd.ProcessSet([1])
        # Horovod: size() / rank() of a set not registered yet are None; repr never raises
        return {"size": ps.size(), "rank": ps.rank(), "repr": repr(hvd.global_process_set)}

    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        g = hvd.global_process_set
        out = {"global": (g.process_set_id, g.ranks, g.size(), g.rank(), g.included())}
        one = hvd.add_process_set([1])
        out["added"] = (
            type(one).__name__,
            one.process_set_id,
            one.ranks,
            one.size(),
            one.rank(),
            one.included(),
        )
        # named: an unnamed op that only some ranks run shifts their automatic names (as the
        # handle-numbered names of Horovod do), so later unnamed ops would not match
        out["ar"] = (
            hvd.allreduce(torch.ones(1), op=hvd.Sum, name="parity.ps.one", process_set=one).tolist()
            if r == 1
            else None
        )
        out["duplicate"] = _err(lambda: hvd.add_process_set(one))
        out["removed"] = (hvd.remove_process_set(one), one.process_set_id, hvd.remove_process_set(one))
        both = hvd.add_process_set(hvd.ProcessSet([1, 0]))
        out["both"] = (both.ranks, hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=both).tolist())
        hvd.remove_process_set(both)
        out["bad_ranks"] = _err(lambda: hvd.add_process_set([0, 7]))
        return out

    def test_unregistered_sets(self, job):
        for res in job:
            assert res["before_init"]["TestProcessSets"]["size"] is None
            assert res["before_init"]["TestProcessSets"]["rank"] is None
            assert "ProcessSet" in res["before_init"]["TestProcessSets"]["repr"]

    def test_global_set(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            assert res["global"] == (0, [0, 1], 2, r, True)

    def test_add_use_remove(self, job):
        for r, res in enumerate(_by_rank(job, type(self))):
            name, set_id, ranks, size, rank, included = res["added"]
            assert name == "ProcessSet" and type(set_id) is int and set_id > 0
            assert (ranks, size, rank, included) == ([1], 1, 0 if r == 1 else -1, r == 1)
            assert res["ar"] == ([1.0] if r == 1 else None)
            assert "ValueError" in res["duplicate"][1]  # Horovod: ValueError for a duplicate set
            assert res["removed"] == (True, None, False)  # Horovod: True once, then False
            assert res["both"] == ([0, 1], [2.0])
            assert res["bad_ranks"] is not None and "ValueError" in res["bad_ranks"][1]


# ---- objects, parameters, optimizer state ---------------------------------------------


@covers("broadcast_object", "allgather_object")
class TestObjects:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        obj = {"rank": r, "lambda": (lambda v: v + r) if r == 0 else None}
        got = hvd.broadcast_object(obj)  # default root 0
        return {
            "bcast": (got["rank"], got["lambda"](1)),
            "bcast_root1": hvd.broadcast_object([r], root_rank=1),
            "gathered": hvd.allgather_object({"r": r}),
        }

    def test_objects(self, job):
        for res in _by_rank(job, type(self)):
            assert res["bcast"] == (0, 1)  # cloudpickle, as in Horovod: lambdas travel
            assert res["bcast_root1"] == [1]
            assert res["gathered"] == [{"r": 0}, {"r": 1}]


@covers("broadcast_parameters", "broadcast_optimizer_state")
class TestBroadcastState:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        torch.manual_seed(r)
        model = torch.nn.Linear(3, 2)
        hvd.broadcast_parameters(model.state_dict(), root_rank=1)
        from_state_dict = [p.detach().clone() for p in model.parameters()]
        torch.manual_seed(10 + r)
        model2 = torch.nn.Linear(3, 2)
        hvd.broadcast_parameters(model2.named_parameters(), root_rank=0)
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
        if r == 1:
            model(torch.ones(1, 3)).sum().backward()
            opt.step()  # only the root has state
        hvd.broadcast_optimizer_state(opt, root_rank=1)
        return {
            "params": from_state_dict,
            "params2": [p.detach().clone() for p in model2.parameters()],
            "lr": opt.param_groups[0]["lr"],
            "state_steps": sorted(float(s["step"]) for s in opt.state.values()),
            "bad_params": _err(lambda: hvd.broadcast_parameters(torch.ones(1), 0)),
        }

    def test_every_rank_gets_the_roots_values(self, job):
        a, b = _by_rank(job, type(self))
        assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
        assert all(torch.equal(x, y) for x, y in zip(a["params2"], b["params2"]))
        assert a["lr"] == b["lr"] == pytest.approx(0.02)
        assert a["state_steps"] == b["state_steps"] == [1.0, 1.0]

    def test_bad_params_is_a_value_error(self, job):
        # Horovod: ValueError('invalid params of type: ...')
        for res in _by_rank(job, type(self)):
            assert "ValueError" in res["bad_params"][1]


@covers("Compression")
class TestCompression:
    def test_none_and_fp16(self):
        import hvdlite.torch as hvd

        x = torch.arange(4.0, dtype=torch.float32)
        c, ctx = hvd.Compression.none.compress(x)
        assert c is x and hvd.Compression.none.decompress(c, ctx) is x
        c, ctx = hvd.Compression.fp16.compress(x)
        assert c.dtype == torch.float16
        back = hvd.Compression.fp16.decompress(c, ctx)
        assert back.dtype == torch.float32 and torch.equal(back, x)
        ints = torch.arange(3)
        c, ctx = hvd.Compression.fp16.compress(ints)  # only floating point is compressed
        assert c.dtype == torch.int64 and hvd.Compression.fp16.decompress(c, ctx).dtype == torch.int64


@covers("DistributedOptimizer")
class TestDistributedOptimizer:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1, bias=False)
        base = torch.optim.SGD(model.parameters(), lr=1.0)
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
        before = model.weight.detach().clone()
        (model(torch.full((1, 2), float(r + 1)))).sum().backward()
        opt.step()
        out = {
            "isinstance": isinstance(opt, torch.optim.SGD),
            "class": type(opt).__name__,
            "update": (before - model.weight.detach()).tolist(),  # lr * averaged gradient
        }
        out["dup_names"] = _err(
            lambda: hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=1.0),
                named_parameters=[("w", model.weight), ("w", model.weight)],
            )
        )
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        out["zero_grad_early"] = _err(opt.zero_grad)  # Horovod: AssertionError
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        return out

    def test_wraps_and_averages(self, job):
        for res in _by_rank(job, type(self)):
            assert res["isinstance"] is True  # a subclass of the wrapped optimizer's class
            assert res["update"] == [[1.5, 1.5]]  # mean of inputs 1 and 2

    def test_errors(self, job):
        for res in _by_rank(job, type(self)):
            assert "ValueError" in res["dup_names"][1]  # Horovod: ValueError for duplicate names
            assert "AssertionError" in res["zero_grad_early"][1]


@covers("SyncBatchNorm")
class TestSyncBatchNorm:
    @staticmethod
    def on_rank(hvd):
        r = hvd.rank()
        torch.manual_seed(3)
        full = torch.randn(4, 3, 5)
        bn = hvd.SyncBatchNorm(3)
        out = bn(full[2 * r : 2 * r + 2])
        return {
            "out": out.detach(),
            "running_mean": bn.running_mean.clone(),
            "is_batchnorm": isinstance(bn, torch.nn.modules.batchnorm._BatchNorm),
            "bad_dim": _err(lambda: bn(torch.ones(3))),
        }

    def test_matches_batchnorm_on_the_global_batch(self, job):
        torch.manual_seed(3)
        full = torch.randn(4, 3, 5)
        ref = torch.nn.BatchNorm1d(3)
        want = ref(full).detach()
        for r, res in enumerate(_by_rank(job, type(self))):
            assert res["is_batchnorm"] is True
            torch.testing.assert_close(res["out"], want[2 * r : 2 * r + 2], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(res["running_mean"], ref.running_mean, rtol=1e-5, atol=1e-6)
            assert "ValueError" in res["bad_dim"][1]  # Horovod: ValueError('expected at least 2D input')
