// Array float16 / bfloat16 conversions with a once-chosen implementation
// (see half_block.h).
#include "algorithms/half_block.h"

#include "algorithms/half.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HVD_HAVE_F16C_PATH 1
#include <immintrin.h>
#endif

// An AVX2 clone of the portable loops, dispatched by the dynamic loader
// (needs ifunc, i.e. ELF/glibc).
#if defined(HVD_HAVE_F16C_PATH) && defined(__linux__) && defined(__GLIBC__)
#define HVD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HVD_CLONES
#endif

namespace hvdlite {
namespace halfblock {
namespace {

HVD_CLONES void BF16ToFloatLoop(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16BitsToFloat(src[i]);
}

HVD_CLONES void FloatToBF16Loop(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16Bits(src[i]);
}

HVD_CLONES void HalfToFloatLoop(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfBitsToFloat(src[i]);
}

HVD_CLONES void FloatToHalfLoop(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalfBits(src[i]);
}

#ifdef HVD_HAVE_F16C_PATH
__attribute__((target("avx,f16c"))) void HalfToFloatF16C(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

__attribute__((target("avx,f16c"))) void FloatToHalfF16C(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}
#endif

struct HalfImpl {
  void (*to_float)(const uint16_t*, float*, int64_t);
  void (*from_float)(const float*, uint16_t*, int64_t);
  const char* name;
};

const HalfImpl& Impl() {
  static const HalfImpl impl = [] {
#ifdef HVD_HAVE_F16C_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c")) {
      return HalfImpl{HalfToFloatF16C, FloatToHalfF16C, "f16c"};
    }
#endif
    return HalfImpl{HalfToFloatLoop, FloatToHalfLoop, "portable"};
  }();
  return impl;
}

}  // namespace

void HalfToFloat(const uint16_t* src, float* dst, int64_t n) { Impl().to_float(src, dst, n); }
void FloatToHalf(const float* src, uint16_t* dst, int64_t n) { Impl().from_float(src, dst, n); }
void BFloat16ToFloat(const uint16_t* src, float* dst, int64_t n) { BF16ToFloatLoop(src, dst, n); }
void FloatToBFloat16(const float* src, uint16_t* dst, int64_t n) { FloatToBF16Loop(src, dst, n); }
void HalfToFloatPortable(const uint16_t* src, float* dst, int64_t n) { HalfToFloatLoop(src, dst, n); }
void FloatToHalfPortable(const float* src, uint16_t* dst, int64_t n) { FloatToHalfLoop(src, dst, n); }
const char* HalfImplName() { return Impl().name; }

}  // namespace halfblock
}  // namespace hvdlite
