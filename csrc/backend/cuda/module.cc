// Exported entry points of libhvdlite_cuda.so: the factory the core dlopens
// (backend/gpu_backend.h), and small helpers the GPU tests drive through
// ctypes (device memory and the fusion kernels, without any framework).
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/nccl_backend.h"
#include "backend/cuda/nccl_comm.h"
#include "rendezvous/store.h"

using namespace hvdlite;

namespace {

int Fail(StatusCode code, const std::string& message, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) {
    std::strncpy(err, message.c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  return static_cast<int>(code);
}

}  // namespace

#define HVD_EXPORT extern "C" __attribute__((visibility("default")))

// Fails (NotSupported) on a machine without a usable CUDA device, so the core
// refuses CUDA tensors at enqueue instead of failing inside a collective.
HVD_EXPORT int hvdlite_gpu_backend_create(int abi_version, GpuHost* host, GpuBackend** out, char* err,
                                          size_t err_len) {
  if (abi_version != kGpuAbiVersion) {
    return Fail(StatusCode::kInternal,
                "libhvdlite_cuda.so was built for another hvdlite core (ABI " +
                    std::to_string(kGpuAbiVersion) + ", core " + std::to_string(abi_version) +
                    "): rebuild hvdlite",
                err, err_len);
  }
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return Fail(StatusCode::kNotSupported,
                std::string("no usable CUDA device for hvdlite's NCCL module: ") +
                    (e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices"),
                err, err_len);
  }
  *out = new cuda::NcclBackend(host);
  return 0;
}

// ---- test helpers (tests/test_gpu.py); return a cudaError_t, 0 = success ----

HVD_EXPORT int hvdlite_cuda_test_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

HVD_EXPORT void* hvdlite_cuda_test_malloc(size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : nullptr;
}

HVD_EXPORT int hvdlite_cuda_test_free(void* p) { return cudaFree(p); }

// to_device: 1 host -> device, 0 device -> host. Synchronous.
HVD_EXPORT int hvdlite_cuda_test_copy(void* dst, const void* src, size_t bytes, int to_device) {
  return cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
}

// One batched scaled copy of n (src, dst, count) device triples, on the
// default stream, then a synchronisation.
HVD_EXPORT int hvdlite_cuda_test_batched_copy(void* const* srcs, void* const* dsts, const int64_t* counts,
                                              int n, int dtype, double factor) {
  std::vector<cuda::CopySpec> specs;
  for (int i = 0; i < n; ++i) specs.push_back(cuda::CopySpec{srcs[i], dsts[i], counts[i]});
  cudaError_t e = cuda::BatchedScaledCopy(specs.data(), n, static_cast<DataType>(dtype), factor, nullptr);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

// Sets up a communicator of `n` members as member `me` on device 0 through an
// in-process store where no other member ever arrives (n == 1: it completes).
// Bounded by timeout_s: returns the StatusCode (Timeout naming the missing
// ranks, with the message in err), 0 when the communicator was made.
HVD_EXPORT int hvdlite_cuda_test_comm_setup(int me, int n, double timeout_s, char* err, size_t err_len) {
  cudaError_t e = cudaSetDevice(0);
  if (e != cudaSuccess) return Fail(StatusCode::kInternal, cudaGetErrorString(e), err, err_len);
  std::unique_ptr<Store> store = NewMemoryStore();
  cuda::CommSetup setup;
  setup.store = store.get();
  setup.key = "test/nccl/0";
  for (int r = 0; r < n; ++r) setup.ranks.push_back(r);
  setup.me = me;
  setup.timeout_s = timeout_s;
  setup.what = "the test communicator";
  ncclComm_t comm = nullptr;
  Status st = cuda::InitNcclComm(setup, &comm);
  if (!st.ok()) return Fail(st.code(), st.message(), err, err_len);
  ncclCommDestroy(comm);
  return 0;
}
