"""torch's parallel training on the "hvdlite" backend equals one process on the whole batch:
DDP (overlapped buckets, no_sync, gradient_as_bucket_view, a comm hook), FSDP2 (reshard after
forward or not), tensor parallelism through DTensor, torch.distributed.pipelining schedules and
torch.distributed.checkpoint. Bodies in tests/torch_backend_models.py."""

import pytest
import torch_backend_models as models
from helpers import run_pooled

TOL = 1e-5  # fp32 rounding of reductions in another order


@pytest.mark.parametrize("variant", ["buckets", "no_sync", "bucket_view", "hook"])
def test_ddp_equals_one_process(variant):
    for err, identical in run_pooled(models.ddp, 2, args=(variant,), timeout=120):
        assert err < TOL and identical


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_equals_one_process(reshard):
    assert max(run_pooled(models.fsdp2, 2, args=(reshard,), timeout=120)) < TOL


def test_tensor_parallel_equals_one_process():
    for out_err, grad_err in run_pooled(models.tensor_parallel, 2, timeout=120):
        assert out_err < TOL and grad_err < TOL


@pytest.mark.parametrize("schedule", ["ScheduleGPipe", "Schedule1F1B"])
def test_pipelining_equals_one_process(schedule):
    for grad_err, loss_err in run_pooled(models.pipelining, 2, args=(schedule,), timeout=120):
        assert grad_err < TOL and loss_err < TOL


@pytest.mark.slow
def test_pipelining_on_3_ranks():
    for grad_err, loss_err in run_pooled(models.pipelining, 3, args=("Schedule1F1B",), timeout=120):
        assert grad_err < TOL and loss_err < TOL


def test_distributed_checkpoint_round_trip(tmp_path):
    assert run_pooled(models.distributed_checkpoint, 2, args=(str(tmp_path / "ckpt"),), timeout=120) == [
        True,
        True,
    ]
