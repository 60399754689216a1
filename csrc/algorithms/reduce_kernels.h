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

// buf[i] *= factor, computed in double for integers (result truncated toward
// zero) and in float for float16/bfloat16. No-op when factor == 1.0.
Status ScaleBuffer(void* buf, int64_t count, DataType dtype, double factor);

// Half-precision conversions (exposed for tests and for adapters).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace hvdlite
