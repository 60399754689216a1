"""hvdlite.torch against Horovod 0.28.1's semantics, public name by public name.

Each ``Test*`` class in the test_parity_torch*.py files covers the horovod.torch names given
to its ``@covers(...)`` decorator: dtypes, return types, exception types, defaults (checked
against Horovod's signatures, recorded here as facts read from its source at v0.28.1) and
in-place behaviour. The parts that need a job run once per file, on 2 real ranks (``job``
fixture, tests/parity_torch.py); the tests then judge the results. This file: the name list,
signatures, basics, join, timeline and process sets; test_parity_torch_collectives.py: the
collectives; test_parity_torch_training.py: objects, optimizer state, DistributedOptimizer,
Compression, SyncBatchNorm.

tests/data/horovod_0.28.1_api.json lists horovod.torch's public names; every one is either
covered by a class or listed in NOT_YET_HERE with the reason (test_every_name_is_covered_or_listed
checks both ways, so the list only shrinks).
"""

import inspect
import os

import pytest
import test_parity_torch_collectives  # noqa: F401 - registers the names it covers
import test_parity_torch_training  # noqa: F401 - registers the names it covers
import torch
from parity_torch import COVERED, HOROVOD_TORCH_NAMES, by_rank, covers, err, job_fixture

job = job_fixture(__name__)

# Names of horovod.torch not covered yet, and why.
NOT_YET_HERE = {
    "check_extension": "horovod.common.util helper (build-time extension check); hvdlite lacks it",
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
        return {"is_initialized": hvd.is_initialized(), "rank": err(hvd.rank), "size": err(hvd.size)}

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
            for raised in (res["before_init"]["TestInitShutdown"]["rank"], res["after_shutdown"]["rank"]):
                assert raised is not None and "ValueError" in raised[1], raised


@covers("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
class TestTopology:
    @staticmethod
    def on_rank(hvd):
        return {
            n: getattr(hvd, n)()
            for n in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
        }

    def test_ints_describing_one_host(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
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
        out["mpi_threads_supported"] = err(hvd.mpi_threads_supported)
        return out

    def test_return_types_are_horovods(self, job):
        for res in by_rank(job, type(self)):
            # Horovod: bools, except nccl_built(), which is NCCL_VERSION_CODE (an int; 0 without NCCL)
            for n in ("mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "ddl_built", "ccl_built"):
                assert type(res[n]) is bool, n
            assert type(res["cuda_built"]) is bool and type(res["rocm_built"]) is bool
            assert type(res["nccl_built"]) is int and res["nccl_built"] >= 0
            assert res["nccl_built"] == 0 or res["nccl_built"] >= 2000  # e.g. 23203 for NCCL 2.32.3
            assert res["ddl_built"] is False and res["ccl_built"] is False and res["rocm_built"] is False

    def test_job_without_mpi(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
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
        for res in by_rank(job, type(self)):
            assert res == ("MismatchError", True, True)


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
                e1 = err(lambda: hvd.allgather(torch.ones(1), name="parity.join.ag"))
                e2 = err(lambda: hvd.broadcast(torch.ones(1), r, name="parity.join.bc"))
                lasts.append(hvd.join())
                out["while_joined_%d" % first] = (s.tolist(), e1, e2)
        out["lasts"] = lasts
        return out

    def test_barrier_returns_none(self, job):
        assert all(res["barrier"] is None for res in by_rank(job, type(self)))

    def test_join_returns_the_last_rank_everywhere(self, job):
        for res in by_rank(job, type(self)):
            assert res["lasts"] == [1, 0] and all(type(v) is int for v in res["lasts"])

    def test_only_allreduce_runs_with_joined_ranks(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            s, e1, e2 = res["while_joined_%d" % (1 - r)]
            assert s == [float(r + 1)] * 2  # the joined rank adds zeros
            for raised in (e1, e2):  # Horovod's tests: (torch.FatalError, RuntimeError)
                assert raised is not None and "RuntimeError" in raised[1] and "joined" in raised[2], raised


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
        results = by_rank(job, type(self))
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
        out["duplicate"] = err(lambda: hvd.add_process_set(one))
        out["removed"] = (hvd.remove_process_set(one), one.process_set_id, hvd.remove_process_set(one))
        # Horovod: the global set's ranks again are a duplicate (test_tensorflow_process_sets_dynamic)
        out["global_again"] = err(lambda: hvd.add_process_set(hvd.ProcessSet([1, 0])))
        both = hvd.add_process_set(hvd.ProcessSet([1, 0]), allow_duplicate=True)  # hvdlite's add-ons
        out["both"] = (both.ranks, hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=both).tolist())
        hvd.remove_process_set(both)
        out["bad_ranks"] = err(lambda: hvd.add_process_set([0, 7]))
        return out

    def test_unregistered_sets(self, job):
        for res in job:
            assert res["before_init"]["TestProcessSets"]["size"] is None
            assert res["before_init"]["TestProcessSets"]["rank"] is None
            assert "ProcessSet" in res["before_init"]["TestProcessSets"]["repr"]

    def test_global_set(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            assert res["global"] == (0, [0, 1], 2, r, True)

    def test_add_use_remove(self, job):
        for r, res in enumerate(by_rank(job, type(self))):
            name, set_id, ranks, size, rank, included = res["added"]
            assert name == "ProcessSet" and type(set_id) is int and set_id > 0
            assert (ranks, size, rank, included) == ([1], 1, 0 if r == 1 else -1, r == 1)
            assert res["ar"] == ([1.0] if r == 1 else None)
            assert "ValueError" in res["duplicate"][1]  # Horovod: ValueError for a duplicate set
            assert res["removed"] == (True, None, False)  # Horovod: True once, then False
            assert "ValueError" in res["global_again"][1]
            assert res["both"] == ([0, 1], [2.0])
            assert res["bad_ranks"] is not None and "ValueError" in res["bad_ranks"][1]


# ---- elastic ------------------------------------------------------------------------------


@covers("elastic")
class TestElastic:
    """horovod.torch.elastic's public names; behaviour (a killed worker, hosts added and removed,
    reset limits) is tested on real jobs in tests/test_elastic.py."""

    def test_horovod_names(self):
        import hvdlite.torch as hvd
        from hvdlite.common import exceptions

        for name in ("run", "State", "ObjectState", "TorchState", "ElasticSampler"):
            assert hasattr(hvd.elastic, name), name
        assert hvd.elastic.HorovodInternalError is exceptions.HorovodInternalError
        assert issubclass(hvd.elastic.TorchState, hvd.elastic.State)
        assert issubclass(hvd.elastic.HostsUpdatedInterrupt, RuntimeError)
