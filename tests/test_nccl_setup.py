"""The NCCL communicator set-up is bounded (csrc/backend/cuda/nccl_comm.h): a rank that never
arrives makes it fail with a Timeout naming that rank, never a hang. Driven through the NCCL
module's test export hvdlite_cuda_test_comm_setup (one process, device 0, an in-process store
where the other members never arrive). Marked `gpu`: skipped where no GPU is present; the
module's exports are checked wherever it is built."""

import ctypes
import os
import time

import pytest

import hvdlite

MODULE = os.path.join(os.path.dirname(hvdlite.__file__), "libhvdlite_cuda.so")
TIMEOUT_CODE = 4  # StatusCode::kTimeout (csrc/common/status.h)


def _module():
    if not os.path.exists(MODULE):
        pytest.skip("hvdlite was built without its NCCL module (needs nvcc and the nvidia-nccl-cu13 wheel)")
    try:
        lib = ctypes.CDLL(MODULE)
    except OSError as e:
        pytest.skip("the NCCL module cannot load here (%s)" % e)
    lib.hvdlite_cuda_test_comm_setup.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_double,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.hvdlite_cuda_test_comm_setup.restype = ctypes.c_int
    return lib


def _gpu_module():
    lib = _module()
    if lib.hvdlite_cuda_test_device_count() == 0:
        pytest.skip("no CUDA GPU on this machine (or no driver)")
    return lib


def _setup(lib, me, n, timeout_s):
    err = ctypes.create_string_buffer(4096)
    start = time.monotonic()
    code = lib.hvdlite_cuda_test_comm_setup(me, n, timeout_s, err, len(err))
    return code, err.value.decode(), time.monotonic() - start


def test_module_exports_the_setup_entry_point():
    lib = _module()
    assert lib.hvdlite_cuda_test_comm_setup is not None


@pytest.mark.gpu
def test_a_one_member_communicator_sets_up():
    code, err, _ = _setup(_gpu_module(), 0, 1, 30.0)
    assert code == 0, err


@pytest.mark.gpu
def test_missing_ranks_time_out_the_init_and_are_named():
    # Member 0 publishes the id; members 1..3 never arrive: the non-blocking init is aborted.
    code, err, elapsed = _setup(_gpu_module(), 0, 4, 3.0)
    assert code == TIMEOUT_CODE, err
    assert "ranks 1, 2, 3 never arrived" in err, err
    print("\nNCCL init with 3 missing ranks gave up after %.2f s (bound 3 s)" % elapsed)


@pytest.mark.gpu
def test_a_missing_member_0_times_out_the_id_exchange_and_is_named():
    code, err, _ = _setup(_gpu_module(), 1, 2, 2.0)
    assert code == TIMEOUT_CODE, err
    assert "rank 0 never arrived" in err and "NCCL id" in err, err
