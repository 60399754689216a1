// CUDA kernels of the NCCL module: batched, scaled copies for the fusion
// buffer (pack before a fused collective, unpack after) and in-place scaling.
// Scaling rounds as the CPU path does (algorithms/reduce_kernels.h): float16
// and bfloat16 multiply in float, float32 in double, integers in double
// truncated toward zero, then round to the element type once.
// Every launcher enqueues on `stream` and returns at once (no synchronisation).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/dtype.h"

namespace hvdlite {
namespace cuda {

// One copy of a batch: `count` elements from src to dst.
struct CopySpec {
  const void* src;
  void* dst;
  int64_t count;
};

// Copies every spec (up to any number; launched in groups of kCopyBatch per
// kernel) multiplying each element by `factor`; a plain copy when factor == 1.
constexpr int kCopyBatch = 32;
cudaError_t BatchedScaledCopy(const CopySpec* specs, int n, DataType dtype, double factor,
                              cudaStream_t stream);

// buf[i] *= factor for i < count; nothing when factor == 1.
cudaError_t ScaleInPlace(void* buf, int64_t count, DataType dtype, double factor, cudaStream_t stream);

// Bytes per element of the dtypes the module handles (0 for others).
size_t ElementSize(DataType dtype);

}  // namespace cuda
}  // namespace hvdlite
