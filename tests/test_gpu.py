"""The NCCL/CUDA module (libhvdlite_cuda.so, csrc/backend/cuda/).

Everywhere: it is built when nvcc and the NCCL wheel are there (CI's compile check), and a
CUDA tensor on a machine that cannot run it fails at once with the reason. On a GPU (tests
marked `gpu`, skipped elsewhere): the fusion kernels against NumPy, and a one-rank NCCL
allreduce / broadcast through the core. Device memory comes from the module's own test
helpers (ctypes), so no CUDA build of a framework is needed.
"""

import ctypes
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
from helpers import run_ranks

import hvdlite

MODULE = os.path.join(os.path.dirname(hvdlite.__file__), "libhvdlite_cuda.so")
DTYPE_CODES = {
    np.dtype(np.uint8): 0,
    np.dtype(np.int8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.int64): 3,
    np.dtype(np.float16): 4,
    np.dtype(ml_dtypes.bfloat16): 5,
    np.dtype(np.float32): 6,
    np.dtype(np.float64): 7,
}


def _nccl_wheel():
    try:
        import nvidia.nccl  # noqa: F401

        return True
    except ImportError:
        return False


def _gpu_count():
    if not os.path.exists(MODULE):
        return 0
    try:
        return ctypes.CDLL(MODULE).hvdlite_cuda_test_device_count()
    except OSError:
        return 0


def _skip_without_gpu():
    if not os.path.exists(MODULE):
        pytest.skip("hvdlite was built without its NCCL module (needs nvcc and the nvidia-nccl-cu13 wheel)")
    if _gpu_count() == 0:
        pytest.skip("no CUDA GPU on this machine (or no driver)")


def test_module_is_built_where_nvcc_and_nccl_are():
    if os.environ.get("HVDLITE_WITH_CUDA") == "0":
        pytest.skip("HVDLITE_WITH_CUDA=0")
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")) or not _nccl_wheel():
        pytest.skip("no nvcc or no NCCL wheel here: nothing to compile")
    assert os.path.exists(MODULE), "nvcc and NCCL are present but the NCCL module was not built"
    info = hvdlite._core.build_info()
    assert info["nccl"] and info["cuda"] and hvdlite.nccl_built() and hvdlite.cuda_built()
    # Horovod's value: NCCL_VERSION_CODE of the nccl.h built against (2.7.0 and later: >= 20700)
    assert type(hvdlite.nccl_built()) is int and hvdlite.nccl_built() >= 20700


def _cuda_tensor_without_gpu():
    import hvdlite as hvd
    from hvdlite.common import ops

    hvd.init()
    x = np.ones(4, np.float32)
    out = []
    for op_type in (ops.ALLREDUCE, ops.ALLGATHER):
        try:
            ops.submit(op_type, "cuda.x", x.ctypes.data, 6, [4], device=0)
            out.append(None)
        except hvd.NotSupportedError as e:
            out.append(str(e))
    out.append(hvd.allreduce(x, op=hvd.Sum, name="after").tolist())  # the job is unharmed
    hvd.shutdown()
    return out


def test_cuda_tensor_fails_at_once_where_it_cannot_run():
    if _gpu_count() > 0:
        pytest.skip("this machine has a GPU: the gpu tests cover it")
    for allreduce_err, allgather_err, after in run_ranks(_cuda_tensor_without_gpu, 2, timeout=60):
        assert allreduce_err is not None and "CUDA" in allreduce_err
        assert "cuda.x" in allreduce_err
        if os.path.exists(MODULE):
            assert "no usable CUDA device" in allreduce_err
        else:
            assert "without CUDA/NCCL support" in allreduce_err
        assert allgather_err is not None and "allgather of CUDA tensor" in allgather_err
        assert after == [2.0] * 4


class _Device:
    """Device buffers through the module's test helpers."""

    def __init__(self):
        self.lib = ctypes.CDLL(MODULE)
        self.lib.hvdlite_cuda_test_malloc.restype = ctypes.c_void_p
        self.lib.hvdlite_cuda_test_malloc.argtypes = [ctypes.c_size_t]
        self.lib.hvdlite_cuda_test_free.argtypes = [ctypes.c_void_p]
        self.lib.hvdlite_cuda_test_copy.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
        ]
        self.lib.hvdlite_cuda_test_batched_copy.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_int64),
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_double,
        ]
        self.owned = []

    def put(self, array):
        array = np.ascontiguousarray(array)
        ptr = self.lib.hvdlite_cuda_test_malloc(max(1, array.nbytes))
        assert ptr, "cudaMalloc failed"
        self.owned.append(ptr)
        assert self.lib.hvdlite_cuda_test_copy(ptr, array.ctypes.data, array.nbytes, 1) == 0
        return ptr

    def get(self, ptr, like):
        out = np.empty_like(like)
        assert self.lib.hvdlite_cuda_test_copy(out.ctypes.data, ptr, out.nbytes, 0) == 0
        return out

    def batched_copy(self, srcs, dsts, counts, dtype, factor):
        n = len(srcs)
        rc = self.lib.hvdlite_cuda_test_batched_copy(
            (ctypes.c_void_p * n)(*srcs),
            (ctypes.c_void_p * n)(*dsts),
            (ctypes.c_int64 * n)(*counts),
            n,
            DTYPE_CODES[np.dtype(dtype)],
            factor,
        )
        assert rc == 0, "batched copy failed with cudaError %d" % rc

    def free(self):
        for p in self.owned:
            self.lib.hvdlite_cuda_test_free(p)


def _scaled(x, factor):
    """The CPU path's rounding (reduce_kernels.h): halves in float32, float32 via float64,
    integers via float64 truncated toward zero."""
    if x.dtype in (np.float16, ml_dtypes.bfloat16):
        return (x.astype(np.float32) * np.float32(factor)).astype(x.dtype)
    if np.issubdtype(x.dtype, np.integer):
        return np.trunc(x.astype(np.float64) * factor).astype(x.dtype)
    return (x.astype(np.float64) * factor).astype(x.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPE_CODES))
def test_batched_pack_unpack_kernels_match_numpy(dtype):
    _skip_without_gpu()
    dev = _Device()
    try:
        rng = np.random.default_rng(3)
        counts = [0, 1, 7, 1000, 70001] + [5] * 40  # more tensors than one kernel batch
        arrays = [(rng.standard_normal(c) * 20).astype(dtype) for c in counts]
        for factor in (1.0, 0.25, 3.0):
            srcs = [dev.put(a) for a in arrays]
            dsts = [dev.put(np.zeros_like(a)) for a in arrays]
            dev.batched_copy(srcs, dsts, counts, dtype, factor)
            for a, d in zip(arrays, dsts):
                got = dev.get(d, a)
                assert got.tobytes() == _scaled(a, factor).tobytes(), (np.dtype(dtype).name, factor, a.size)
    finally:
        dev.free()


def _one_rank_nccl():
    import hvdlite as hvd
    from hvdlite.common import ops

    hvd.init()
    dev = _Device()
    out = {}
    try:
        for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.int32):
            arrays = [np.arange(n).astype(dtype) for n in (3, 1000)]
            ptrs = [dev.put(a) for a in arrays]
            handles = [
                ops.submit(
                    ops.ALLREDUCE,
                    "g.%d.%s" % (i, np.dtype(dtype).name),
                    p,
                    DTYPE_CODES[np.dtype(dtype)],
                    [a.size],
                    reduce_op=0,
                    prescale=2.0,
                    postscale=0.5,
                    device=0,
                )
                for i, (a, p) in enumerate(zip(arrays, ptrs))
            ]
            for h in handles:
                ops.wait(h)
                hvdlite._core.release(h)
            out[np.dtype(dtype).name] = [dev.get(p, a).tobytes() == a.tobytes() for a, p in zip(arrays, ptrs)]
        b = np.arange(10, dtype=np.float64)
        p = dev.put(b)
        h = ops.submit(ops.BROADCAST, "b", p, 7, [10], root=0, device=0)
        ops.wait(h)
        hvdlite._core.release(h)
        out["broadcast"] = dev.get(p, b).tolist() == b.tolist()
    finally:
        dev.free()
        hvd.shutdown()
    return out


@pytest.mark.gpu
def test_one_rank_nccl_allreduce_and_broadcast_through_the_core():
    _skip_without_gpu()
    out = run_ranks(_one_rank_nccl, 1, timeout=120)[0]
    for key, value in out.items():
        assert value is True or value == [True, True], key
