// Element-wise kernels on raw buffers. Written as plain loops over typed
// pointers so the compiler vectorizes them; float16 and bfloat16 are widened to
// float per element, reduced, and rounded back (round to nearest even).
#pragma once
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

namespace hvdlite {

// dst[i] = op(dst[i], src[i]) for i < count. op is Sum, Min, Max or Product
// (Average is Sum plus a postscale, applied by the caller). NotSupported for
// bool or an unknown op.
Status ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor with Horovod's rounding (its ScaleBufferCPUImpl): integers
// in double, truncated toward zero (saturated where Horovod's cast would be
// undefined); float32, float16 and bfloat16 in float with the factor first
// rounded to float (halves then rounded back to nearest even); float64 in
// double. No-op when factor == 1.0.
Status ScaleBuffer(void* buf, int64_t count, DataType dtype, double factor);

// buf[i] = the value that leaves the other operand of `op` unchanged, for
// i < count: 0 for Sum, 1 for Product, the largest value (+inf for floats)
// for Min and the smallest (-inf) for Max; false (0) for bool.
void FillIdentity(void* buf, int64_t count, DataType dtype, ReduceOp op);

// Half-precision conversions (exposed for tests and for adapters).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace hvdlite
