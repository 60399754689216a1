"""torch CUDA tensors through hvdlite.torch's send / recv: NCCL send/recv in the core's NCCL
module (csrc/runtime/p2p_device.cc, csrc/backend/cuda/nccl_p2p.cc), issue 31.

Marked `gpu`: skipped where torch has no CUDA device or hvdlite was built without its NCCL
module. One GPU suffices: a one-rank job sends to itself (NCCL's grouped send and receive to
self), with tags out of order, a non-contiguous receiving tensor, bfloat16 and a size
mismatch that fails both sides. Two ranks on that one GPU must either exchange the right
values or fail with the error that names the shared GPU and the fix, as the collectives do
(NCCL refuses two members of one communicator on the same device).
"""

import pytest
from cuda_skip import skip_without_cuda
from helpers import run_ranks, spawn_ranks

pytestmark = pytest.mark.gpu


def _to_self():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    dev = torch.device("cuda", 0)
    out = {}
    x = torch.arange(1 << 20, device=dev, dtype=torch.float32)
    y = torch.zeros_like(x)
    h = hvd.send_async(x, 0, tag=3, name="self")
    hvd.recv(y, 0, tag=3, name="self.r")
    hvd.synchronize(h)
    out["self"] = bool(torch.equal(x, y))
    # Out of order by tag: tag 1 is sent first, tag 0 received first.
    a, b = torch.full((5,), 1.0, device=dev), torch.full((5,), 2.0, device=dev)
    ha, hb = hvd.send_async(a, 0, tag=1), hvd.send_async(b, 0, tag=0)
    ra, rb = torch.zeros(5, device=dev), torch.zeros(5, device=dev)
    hvd.recv(rb, 0, tag=0)
    hvd.recv(ra, 0, tag=1)
    hvd.synchronize(ha)
    hvd.synchronize(hb)
    out["tags"] = (ra.tolist(), rb.tolist())
    # A non-contiguous receiving tensor, and bfloat16.
    m = torch.arange(12, device=dev, dtype=torch.bfloat16).reshape(3, 4)
    t = torch.zeros(4, 3, device=dev, dtype=torch.bfloat16).t()
    h = hvd.send_async(m, 0, tag=4)
    hvd.recv(t, 0, tag=4)
    hvd.synchronize(h)
    out["strided"] = bool(torch.equal(t, m))
    # A size mismatch fails the recv and the send, naming both sizes.
    h = hvd.send_async(torch.ones(4, device=dev), 0, tag=5, name="four")
    errors = []
    for call in (
        lambda: hvd.recv(torch.ones(5, device=dev), 0, tag=5, name="five"),
        lambda: hvd.synchronize(h),
    ):
        try:
            call()
            errors.append(None)
        except hvd.HvdliteError as e:
            errors.append(str(e))
    out["mismatch"] = errors
    hvd.shutdown()
    return out


def test_one_rank_sends_cuda_tensors_to_itself():
    skip_without_cuda()
    out = run_ranks(_to_self, 1, timeout=180)[0]
    assert out["self"]
    assert out["tags"] == ([1.0] * 5, [2.0] * 5)
    assert out["strided"]
    recv_error, send_error = out["mismatch"]
    assert recv_error is not None and "16 bytes" in recv_error and "20" in recv_error, recv_error
    assert send_error is not None and "tag 5" in send_error, send_error


def _two_ranks_one_gpu():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    peer = 1 - hvd.rank()
    x = torch.full((1000,), float(hvd.rank() + 1), device="cuda:0")
    y = torch.zeros_like(x)
    try:
        h = hvd.send_async(x, peer, tag=0, name="shared.gpu")
        hvd.recv(y, peer, tag=0, name="shared.gpu.r")
        hvd.synchronize(h)
        return {"got": y.cpu().tolist()[:3]}
    except hvd.HvdliteError as e:
        return {"error": str(e)}
    finally:
        hvd.shutdown()


def test_two_ranks_on_one_gpu_either_exchange_or_say_why():
    skip_without_cuda()
    results = spawn_ranks(_two_ranks_one_gpu, 2, timeout=240, env={"HVDLITE_START_TIMEOUT": "60"})
    for rank, r in enumerate(results):
        assert r.traceback is None and r.exitcode == 0, r.traceback
        if "got" in r.value:
            assert r.value["got"] == [float(2 - rank)] * 3, r.value
        else:
            msg = r.value["error"]  # NCCL: "Duplicate GPU detected" (invalid usage at set-up)
            assert "point-to-point pair of ranks 0 and 1" in msg, msg
            if "one GPU" not in msg:  # the other rank's set-up then waits for this one in vain
                assert "HVDLITE_START_TIMEOUT" in msg or "did not" in msg, msg
            else:
                assert "torch.cuda.set_device(hvd.local_rank())" in msg, msg
