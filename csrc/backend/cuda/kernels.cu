#include "backend/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace hvdlite {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerCopy = 1024;  // grid-stride beyond this

// Passed by value as the kernel argument (well under the 4 KiB limit).
struct Batch {
  const void* src[kCopyBatch];
  void* dst[kCopyBatch];
  int64_t count[kCopyBatch];
};

// Horovod's rounding (its ScaleBufferCudaImpl): integers in double, truncated
// toward zero; float32 in float with the factor rounded to float; float16 in
// half with the factor rounded to half (through float); bfloat16 (which
// Horovod does not scale on GPUs) in float; float64 in double.
template <typename T>
__device__ __forceinline__ T Scale(T x, double f) {
  return static_cast<T>(static_cast<double>(x) * f);
}
template <>
__device__ __forceinline__ float Scale<float>(float x, double f) {
  return x * static_cast<float>(f);
}
template <>
__device__ __forceinline__ double Scale<double>(double x, double f) {
  return x * f;
}
template <>
__device__ __forceinline__ __half Scale<__half>(__half x, double f) {
  // The product of two halves is exact in float, so this is __hmul's result.
  const float hf = __half2float(__float2half_rn(static_cast<float>(f)));
  return __float2half_rn(__half2float(x) * hf);
}
template <>
__device__ __forceinline__ __nv_bfloat16 Scale<__nv_bfloat16>(__nv_bfloat16 x, double f) {
  return __float2bfloat16_rn(__bfloat162float(x) * static_cast<float>(f));
}

// blockIdx.y picks the copy; blocks along x stride over its elements.
template <typename T>
__global__ void BatchedCopyKernel(Batch b, double factor, bool scale) {
  const T* src = static_cast<const T*>(b.src[blockIdx.y]);
  T* dst = static_cast<T*>(b.dst[blockIdx.y]);
  const int64_t n = b.count[blockIdx.y];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    dst[i] = scale ? Scale<T>(src[i], factor) : src[i];
  }
}

template <typename T>
cudaError_t LaunchBatches(const CopySpec* specs, int n, double factor, cudaStream_t stream) {
  for (int first = 0; first < n; first += kCopyBatch) {
    Batch b{};
    const int k = std::min(kCopyBatch, n - first);
    int64_t longest = 0;
    for (int i = 0; i < k; ++i) {
      b.src[i] = specs[first + i].src;
      b.dst[i] = specs[first + i].dst;
      b.count[i] = specs[first + i].count;
      longest = std::max(longest, b.count[i]);
    }
    if (longest == 0) continue;
    const int64_t blocks = std::min<int64_t>(kMaxBlocksPerCopy, (longest + kThreads - 1) / kThreads);
    dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(k));
    BatchedCopyKernel<T><<<grid, kThreads, 0, stream>>>(b, factor, factor != 1.0);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

size_t ElementSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kUInt16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

cudaError_t BatchedScaledCopy(const CopySpec* specs, int n, DataType dtype, double factor,
                              cudaStream_t stream) {
  switch (dtype) {
    case DataType::kUInt8:
      return LaunchBatches<uint8_t>(specs, n, factor, stream);
    case DataType::kInt8:
      return LaunchBatches<int8_t>(specs, n, factor, stream);
    case DataType::kUInt16:
      return LaunchBatches<uint16_t>(specs, n, factor, stream);
    case DataType::kInt16:
      return LaunchBatches<int16_t>(specs, n, factor, stream);
    case DataType::kInt32:
      return LaunchBatches<int32_t>(specs, n, factor, stream);
    case DataType::kInt64:
      return LaunchBatches<int64_t>(specs, n, factor, stream);
    case DataType::kFloat16:
      return LaunchBatches<__half>(specs, n, factor, stream);
    case DataType::kBFloat16:
      return LaunchBatches<__nv_bfloat16>(specs, n, factor, stream);
    case DataType::kFloat32:
      return LaunchBatches<float>(specs, n, factor, stream);
    case DataType::kFloat64:
      return LaunchBatches<double>(specs, n, factor, stream);
    case DataType::kBool:
      return factor == 1.0 ? LaunchBatches<uint8_t>(specs, n, 1.0, stream) : cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

cudaError_t ScaleInPlace(void* buf, int64_t count, DataType dtype, double factor, cudaStream_t stream) {
  if (factor == 1.0 || count == 0) return cudaSuccess;
  CopySpec spec{buf, buf, count};
  return BatchedScaledCopy(&spec, 1, dtype, factor, stream);
}

}  // namespace cuda
}  // namespace hvdlite
