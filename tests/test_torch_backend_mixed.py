"""A per-device backend string naming hvdlite beside another backend ("cpu:hvdlite,cuda:nccl",
"cpu:gloo,cuda:hvdlite"): each call runs on the backend the string gives its tensors' device
(hvdlite/torch_backend/routing.py), in the default group, subgroups and a DeviceMesh."""

import pytest
import torch_backend_mixed_cases as cases
from cuda_skip import skip_without_cuda
from helpers import run_pooled, run_ranks

_EVERY_CALL = ["all_gather", "all_reduce", "all_to_all", "broadcast", "functional", "objects"]
_EVERY_CALL += ["reduce_scatter"]


def _all_right(results, work_type):
    for r in results:
        assert r.pop("work_type") == work_type
        assert sorted(k for k, v in r.items() if v is True) == _EVERY_CALL, r


def test_cpu_tensors_run_on_gloo_where_the_string_gives_cpu_to_gloo():
    for out in run_pooled(cases.gloo_for_cpu, 2, timeout=90):
        assert out["backend"] == "cpu:gloo,cuda:hvdlite" and out["group"] == "MixedProcessGroup"
        assert out["cpu_backend"] == "ProcessGroupGloo" and out["devices"] == ["cpu", "cuda"]
        _all_right([out["world"], out["sub"]], "Work")  # gloo's Work, not hvdlite's
        assert out["p2p"] and out["ddp"]
        assert out["mesh"] == ([2.0, 2.0], "ProcessGroupGloo")
        # hvdlite's core was given none of these calls, in any of the three groups
        assert out["hvdlite_calls"] == [{}, {}, {}]
        assert "tensors on cpu and meta in one call" in out["refusals"]["mixed"]
        assert "'meta:<backend>'" in out["refusals"]["meta"]


@pytest.mark.parametrize("other", ["gloo", "nccl"])
def test_cpu_tensors_run_on_hvdlite_beside_another_cuda_backend(other):
    import torch.distributed as dist

    for out in run_pooled(cases.hvdlite_for_cpu, 2, args=(other,), timeout=90):
        assert out["backend"] == "cpu:hvdlite,cuda:%s" % other and out["group"] == "MixedProcessGroup"
        _all_right([out["world"]], "HvdliteWork")
        assert out["p2p"] and out["ddp"]
        assert out["hvdlite_calls"] == ["allgather", "allreduce", "alltoall", "broadcast", "reducescatter"]
        assert out["sub"] == (2.0, "MixedProcessGroup", ["allreduce"])
        assert out["devices"] == ["cpu", "cuda"]  # so torch's object collectives pick cpu
        if other == "gloo":
            assert out["cuda"] == "ProcessGroupGloo" and out["cuda_lookup"]
        elif dist.is_nccl_available():
            assert out["cuda"] == "ProcessGroupNCCL"
        else:  # init worked; the first call on cuda names the string and the fix
            assert out["cuda"].startswith("NotSupportedError"), out["cuda"]
            assert "'cpu:hvdlite,cuda:nccl'" in out["cuda"] and "no NCCL built in" in out["cuda"]
            assert "'cpu:hvdlite,cuda:hvdlite'" in out["cuda"]


@pytest.mark.gpu
def test_cuda_tensors_run_on_nccl_and_cpu_tensors_on_hvdlite():
    skip_without_cuda(need_nccl_module=False)
    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL built in (torch.distributed.is_nccl_available() is False)")
    size = min(2, torch.cuda.device_count())  # NCCL refuses two ranks on one GPU
    for out in run_ranks(cases.nccl_for_cuda, size, timeout=120):
        assert out["nccl"] == "ProcessGroupNCCL"
        total = float(sum(range(1, size + 1)))
        gathered = [float(i) for i in range(size) for _ in range(2)]
        assert out["cuda"] == ([total] * 4, gathered, False)  # NCCL's Work, not hvdlite's
        assert out["cpu"] == ([total] * 4, ["allreduce"])  # hvdlite counted only the CPU call
