// Element-wise reductions and scaling (see reduce_kernels.h).
//
// Every kernel is a plain loop over typed, non-aliasing pointers with the
// operation inlined, which GCC/Clang vectorize at -O3. Semantics:
//  * integers: Sum and Product wrap modulo 2^bits (computed in an unsigned
//    type, so there is no signed-overflow UB); Min/Max compare signed values.
//  * floats: IEEE Sum/Product; Min/Max propagate NaN (a NaN operand wins) so a
//    NaN gradient is never hidden. Min/Max are not commutative for (-0, +0) or
//    for two NaNs, which is why callers keep one fixed operand order.
//  * float16/bfloat16: blocks of kBlock elements are widened to float, reduced,
//    and rounded back to nearest even (half_block.h; F16C where the CPU has
//    it). One op on two half (or bfloat16) values rounded once to float and
//    then to half gives the correctly rounded half result (float has more
//    than 2p+2 bits), so the block path is exact.
// `dst` and `src` must not partially overlap.
#include "algorithms/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "algorithms/half.h"
#include "algorithms/half_block.h"

namespace hvdlite {
namespace {

constexpr int64_t kBlock = 256;

template <typename T, typename F>
inline void Apply(T* __restrict dst, const T* __restrict src, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
}

// Wrapping a + b and a * b for any integer T: computed in an unsigned type of
// at least int's width (uint16 * uint16 would otherwise be promoted to a signed
// int and overflow), converted back modulo 2^bits.
template <typename T>
using WrapType = std::common_type_t<std::make_unsigned_t<T>, unsigned>;

template <typename T>
inline T WrapAdd(T a, T b) {
  return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
}

template <typename T>
inline T WrapMul(T a, T b) {
  return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
}

template <typename T>
Status ReduceInt(T* dst, const T* src, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      Apply(dst, src, n, [](T a, T b) { return WrapAdd(a, b); });
      return Status::OK();
    case ReduceOp::kProduct:
      Apply(dst, src, n, [](T a, T b) { return WrapMul(a, b); });
      return Status::OK();
    case ReduceOp::kMin:
      Apply(dst, src, n, [](T a, T b) { return b < a ? b : a; });
      return Status::OK();
    case ReduceOp::kMax:
      Apply(dst, src, n, [](T a, T b) { return b > a ? b : a; });
      return Status::OK();
    default:
      return Status::NotSupported(std::string("reduce op ") + ReduceOpName(op) + " in a kernel");
  }
}

template <typename T>
Status ReduceFloat(T* dst, const T* src, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      Apply(dst, src, n, [](T a, T b) { return a + b; });
      return Status::OK();
    case ReduceOp::kProduct:
      Apply(dst, src, n, [](T a, T b) { return a * b; });
      return Status::OK();
    case ReduceOp::kMin:  // a NaN in either operand gives NaN
      Apply(dst, src, n, [](T a, T b) { return (a < b || a != a) ? a : b; });
      return Status::OK();
    case ReduceOp::kMax:
      Apply(dst, src, n, [](T a, T b) { return (a > b || a != a) ? a : b; });
      return Status::OK();
    default:
      return Status::NotSupported(std::string("reduce op ") + ReduceOpName(op) + " in a kernel");
  }
}

// float16 (kBF = false) or bfloat16 (kBF = true) blocks to / from float.
template <bool kBF>
inline void Widen(const uint16_t* src, float* dst, int64_t n) {
  if (kBF) {
    halfblock::BFloat16ToFloat(src, dst, n);
  } else {
    halfblock::HalfToFloat(src, dst, n);
  }
}

template <bool kBF>
inline void Narrow(const float* src, uint16_t* dst, int64_t n) {
  if (kBF) {
    halfblock::FloatToBFloat16(src, dst, n);
  } else {
    halfblock::FloatToHalf(src, dst, n);
  }
}

template <bool kBF>
Status ReduceHalf(uint16_t* dst, const uint16_t* src, int64_t n, ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kProduct && op != ReduceOp::kMin && op != ReduceOp::kMax) {
    return Status::NotSupported(std::string("reduce op ") + ReduceOpName(op) + " in a kernel");
  }
  alignas(64) float a[kBlock];
  alignas(64) float b[kBlock];
  for (int64_t base = 0; base < n; base += kBlock) {
    const int64_t m = std::min(kBlock, n - base);
    Widen<kBF>(dst + base, a, m);
    Widen<kBF>(src + base, b, m);
    ReduceFloat<float>(a, b, m, op);
    Narrow<kBF>(a, dst + base, m);
  }
  return Status::OK();
}

// Integer scaling in double, truncated toward zero, saturated to T's range
// (NaN gives 0) so an out-of-range product is never undefined behaviour.
template <typename T>
void ScaleInt(T* buf, int64_t n, double factor) {
  constexpr bool kSigned = std::numeric_limits<T>::is_signed;
  const double hi = std::ldexp(1.0, std::numeric_limits<T>::digits);  // first value above max
  const double lo = kSigned ? -hi - 1.0 : -1.0;                       // first value below min
  for (int64_t i = 0; i < n; ++i) {
    const double r = static_cast<double>(buf[i]) * factor;
    T v;
    if (r != r) {
      v = 0;
    } else if (r >= hi) {
      v = std::numeric_limits<T>::max();
    } else if (r <= lo) {
      v = std::numeric_limits<T>::min();
    } else {
      v = static_cast<T>(r);
    }
    buf[i] = v;
  }
}

template <bool kBF>
void ScaleHalf(uint16_t* buf, int64_t n, float factor) {
  alignas(64) float a[kBlock];
  for (int64_t base = 0; base < n; base += kBlock) {
    const int64_t m = std::min(kBlock, n - base);
    Widen<kBF>(buf + base, a, m);
    for (int64_t i = 0; i < m; ++i) a[i] *= factor;
    Narrow<kBF>(a, buf + base, m);
  }
}

template <typename T>
void FillTyped(void* buf, int64_t count, T value) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < count; ++i) p[i] = value;
}

template <typename T>
void FillIdentityTyped(void* buf, int64_t count, ReduceOp op) {
  using L = std::numeric_limits<T>;
  T big = L::has_infinity ? L::infinity() : L::max();
  T small = L::has_infinity ? -L::infinity() : L::lowest();
  FillTyped<T>(buf, count,
               op == ReduceOp::kProduct ? T(1)
               : op == ReduceOp::kMin   ? big
               : op == ReduceOp::kMax   ? small
                                        : T(0));
}

// float16 / bfloat16 bit patterns of 1, +inf and -inf.
void FillIdentityHalf(void* buf, int64_t count, ReduceOp op, uint16_t one, uint16_t inf, uint16_t neg_inf) {
  FillTyped<uint16_t>(buf, count,
                      op == ReduceOp::kProduct ? one
                      : op == ReduceOp::kMin   ? inf
                      : op == ReduceOp::kMax   ? neg_inf
                                               : 0);
}

}  // namespace

Status ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op) {
  if (count < 0) return Status::InvalidArgument("ReduceInto: negative count");
  switch (dtype) {
    case DataType::kUInt8:
      return ReduceInt(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, op);
    case DataType::kInt8:
      return ReduceInt(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), count, op);
    case DataType::kUInt16:
      return ReduceInt(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count, op);
    case DataType::kInt16:
      return ReduceInt(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), count, op);
    case DataType::kInt32:
      return ReduceInt(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count, op);
    case DataType::kInt64:
      return ReduceInt(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, op);
    case DataType::kFloat16:
      return ReduceHalf<false>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count, op);
    case DataType::kBFloat16:
      return ReduceHalf<true>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count, op);
    case DataType::kFloat32:
      return ReduceFloat(static_cast<float*>(dst), static_cast<const float*>(src), count, op);
    case DataType::kFloat64:
      return ReduceFloat(static_cast<double*>(dst), static_cast<const double*>(src), count, op);
    default:
      return Status::NotSupported(std::string("reduction of dtype ") + DataTypeName(dtype));
  }
}

Status ScaleBuffer(void* buf, int64_t count, DataType dtype, double factor) {
  if (count < 0) return Status::InvalidArgument("ScaleBuffer: negative count");
  if (dtype == DataType::kBool || DataTypeSize(dtype) == 0) {
    return Status::NotSupported(std::string("scaling of dtype ") + DataTypeName(dtype));
  }
  if (factor == 1.0) return Status::OK();
  switch (dtype) {
    case DataType::kUInt8:
      ScaleInt(static_cast<uint8_t*>(buf), count, factor);
      break;
    case DataType::kInt8:
      ScaleInt(static_cast<int8_t*>(buf), count, factor);
      break;
    case DataType::kUInt16:
      ScaleInt(static_cast<uint16_t*>(buf), count, factor);
      break;
    case DataType::kInt16:
      ScaleInt(static_cast<int16_t*>(buf), count, factor);
      break;
    case DataType::kInt32:
      ScaleInt(static_cast<int32_t*>(buf), count, factor);
      break;
    case DataType::kInt64:
      ScaleInt(static_cast<int64_t*>(buf), count, factor);
      break;
    case DataType::kFloat16:
      ScaleHalf<false>(static_cast<uint16_t*>(buf), count, static_cast<float>(factor));
      break;
    case DataType::kBFloat16:
      ScaleHalf<true>(static_cast<uint16_t*>(buf), count, static_cast<float>(factor));
      break;
    case DataType::kFloat32: {
      // Horovod's rule: the factor is rounded to float first, then one float product.
      float* p = static_cast<float*>(buf);
      const float f = static_cast<float>(factor);
      for (int64_t i = 0; i < count; ++i) p[i] *= f;
      break;
    }
    case DataType::kFloat64: {
      double* p = static_cast<double*>(buf);
      for (int64_t i = 0; i < count; ++i) p[i] *= factor;
      break;
    }
    default:
      break;
  }
  return Status::OK();
}

void FillIdentity(void* buf, int64_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8:
      return FillIdentityTyped<uint8_t>(buf, count, op);
    case DataType::kInt8:
      return FillIdentityTyped<int8_t>(buf, count, op);
    case DataType::kUInt16:
      return FillIdentityTyped<uint16_t>(buf, count, op);
    case DataType::kInt16:
      return FillIdentityTyped<int16_t>(buf, count, op);
    case DataType::kInt32:
      return FillIdentityTyped<int32_t>(buf, count, op);
    case DataType::kInt64:
      return FillIdentityTyped<int64_t>(buf, count, op);
    case DataType::kFloat32:
      return FillIdentityTyped<float>(buf, count, op);
    case DataType::kFloat64:
      return FillIdentityTyped<double>(buf, count, op);
    case DataType::kFloat16:
      return FillIdentityHalf(buf, count, op, 0x3C00, 0x7C00, 0xFC00);
    case DataType::kBFloat16:
      return FillIdentityHalf(buf, count, op, 0x3F80, 0x7F80, 0xFF80);
    case DataType::kBool:
      return FillTyped<uint8_t>(buf, count, 0);
  }
}

float HalfToFloat(uint16_t h) { return HalfBitsToFloat(h); }
uint16_t FloatToHalf(float f) { return FloatToHalfBits(f); }
float BFloat16ToFloat(uint16_t b) { return BFloat16BitsToFloat(b); }
uint16_t FloatToBFloat16(float f) { return FloatToBFloat16Bits(f); }

}  // namespace hvdlite
