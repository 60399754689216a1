"""Errors from hvdlite.torch: raised as Horovod raises them (RuntimeError
subclasses; ValueError / NotImplementedError where Horovod uses those), on
every rank, and the job goes on working afterwards."""

import time

import torch
from helpers import run_pooled


def _catch(fn):
    try:
        fn()
    except Exception as e:
        return type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)
    return None


def _error_cases():
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {
        "shape": _catch(lambda: hvd.allreduce(torch.ones(r + 1), name="bad.shape")),
        "dtype": _catch(
            lambda: hvd.allreduce(
                torch.ones(2, dtype=torch.float32 if r else torch.float64), name="bad.dtype"
            )
        ),
        "allgather_dims": _catch(lambda: hvd.allgather(torch.ones(2, r + 1), name="bad.gather")),
        "root": _catch(lambda: hvd.broadcast(torch.ones(2), root_rank=n, name="bad.root")),
        "root_mismatch": _catch(lambda: hvd.broadcast(torch.ones(2), root_rank=r, name="bad.root2")),
        "splits_sum": _catch(lambda: hvd.alltoall(torch.ones(4), splits=[1] * n, name="bad.splits")),
        "splits_len": _catch(lambda: hvd.alltoall(torch.ones(4), splits=[4], name="bad.splits2")),
        "splits_float": _catch(lambda: hvd.alltoall(torch.ones(n), splits=torch.ones(n), name="bad.splits3")),
        "unsupported_dtype": _catch(lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64))),
        "op_and_average": _catch(lambda: hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)),
        "adasum_ranks": _catch(lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum)),
        "alltoall_scalar": _catch(lambda: hvd.alltoall(torch.tensor(1.0))),
        "sparse": _catch(lambda: hvd.allreduce(torch.ones(2).to_sparse())),
        "bad_params": _catch(lambda: hvd.broadcast_parameters(torch.ones(2), 0)),
    }
    if r != 0:
        time.sleep(1.0)  # keeps rank 0's first "dup" in flight while it submits the second
    handle = hvd.allreduce_async_(torch.ones(3), name="dup")
    out["duplicate"] = _catch(lambda: hvd.allreduce_async_(torch.ones(3), name="dup")) if r == 0 else None
    hvd.synchronize(handle)
    out["unknown_handle"] = _catch(lambda: hvd.synchronize(handle))
    out["after"] = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist()
    hvd.shutdown()
    out["not_initialized"] = _catch(lambda: hvd.rank())
    return out


def test_error_cases_raise_horovod_style_and_job_survives():
    results = run_pooled(_error_cases, 3, timeout=120)
    for r, res in enumerate(results):
        for key in ("shape", "dtype", "allgather_dims", "root_mismatch", "splits_sum", "splits_len"):
            assert res[key] is not None, key
            assert "RuntimeError" in res[key][1] and "HvdliteError" in res[key][1], (key, res[key])
        assert res["shape"][0] == "MismatchError" and "bad.shape" in res["shape"][2]
        assert "bad.dtype" in res["dtype"][2]
        assert res["root"] is not None and "RuntimeError" in res["root"][1]
        assert (
            res["unsupported_dtype"][0] == "NotSupportedError" and "complex64" in res["unsupported_dtype"][2]
        )
        assert "ValueError" in res["op_and_average"][1]
        assert "ValueError" in res["splits_float"][1] and "integers" in res["splits_float"][2]
        assert "NotImplementedError" in res["adasum_ranks"][1] and "power of 2" in res["adasum_ranks"][2]
        assert "ValueError" in res["alltoall_scalar"][1]
        assert "sparse" in res["sparse"][2]
        assert "ValueError" in res["bad_params"][1] and "HvdliteError" in res["bad_params"][1]
        if r == 0:
            assert res["duplicate"][0] == "PreconditionError" and "dup" in res["duplicate"][2]
        assert res["unknown_handle"] is not None
        assert res["after"] == [3.0, 3.0]
        assert res["not_initialized"][0] == "PreconditionError"


def _numpy_adasum():
    import numpy as np

    import hvdlite as hvd

    hvd.init()
    a = np.array([1.0, 0.0, 2.0]) if hvd.rank() == 0 else np.array([0.0, 3.0, 2.0])
    out = hvd.allreduce(a, op=hvd.Adasum, name="ada")
    hvd.shutdown()
    return out


def test_adasum_allreduce_on_numpy_matches_the_formula():
    import numpy as np

    a, b = np.array([1.0, 0.0, 2.0]), np.array([0.0, 3.0, 2.0])
    dot = a @ b
    want = (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b
    for got in run_pooled(_numpy_adasum, 2, timeout=60):
        np.testing.assert_allclose(got, want, rtol=1e-12)
