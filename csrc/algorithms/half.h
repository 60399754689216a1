// Inline, branch-free float16 / bfloat16 <-> float conversions, written so a
// loop over them auto-vectorizes (every path is computed, then selected).
//
// Contracts:
//  * HalfBitsToFloat / BFloat16BitsToFloat are exact for every input, including
//    subnormals, signed zeros and infinities; NaN stays NaN with its payload
//    (HalfBitsToFloat makes a signaling NaN quiet, like x86 F16C).
//  * FloatToHalfBits / FloatToBFloat16Bits round to nearest, ties to even;
//    values beyond the largest finite result become +-Inf; NaN stays NaN (made
//    quiet, sign and top payload bits kept); results below the normal range
//    become correctly rounded subnormals or signed zero. FloatToHalfBits equals
//    the x86 F16C instruction (round to nearest even) on all 2^32 inputs.
// They assume the default floating-point environment (round to nearest, no
// flush-to-zero), which is what every process starts with.
#pragma once
#include <cstdint>
#include <cstring>

namespace hvdlite {
namespace half_detail {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// cond ? a : b through masks, so the compiler emits no branch (a ternary on
// values computed with float operations is otherwise left as control flow
// and blocks vectorization).
inline uint32_t Select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(cond);
  return (a & m) | (b & ~m);
}

}  // namespace half_detail

inline float HalfBitsToFloat(uint16_t h) {
  using half_detail::BitsFloat;
  using half_detail::FloatBits;
  using half_detail::Select;
  const uint32_t kShiftedExp = 0x7c00u << 13;               // half exponent field, in float position
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;  // exponent + mantissa
  const uint32_t exp = o & kShiftedExp;
  o += (127u - 15u) << 23;  // rebias the exponent
  // Inf / NaN: the exponent must become 255; a NaN keeps its payload and is
  // made quiet (as the F16C instruction does).
  const uint32_t quiet = Select((o & 0x007fffffu) != 0, 0x00400000u, 0u);
  const uint32_t inf_nan = (o + ((128u - 16u) << 23)) | quiet;
  // Zero / subnormal: m * 2^-24 computed exactly as (2^-14 * (1 + m/1024)) - 2^-14.
  const float sub = BitsFloat(o + (1u << 23)) - BitsFloat(113u << 23);
  const uint32_t mag = Select(exp == kShiftedExp, inf_nan, Select(exp == 0, FloatBits(sub), o));
  return BitsFloat(mag | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

inline uint16_t FloatToHalfBits(float f) {
  using half_detail::BitsFloat;
  using half_detail::FloatBits;
  using half_detail::Select;
  uint32_t x = FloatBits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;  // |f|
  // |f| >= 65536: Inf (also for f = Inf) or quiet NaN keeping the top payload bits.
  // (65520 <= |f| < 65536 rounds up to Inf through the normal path's carry.)
  const uint32_t big = Select(x > 0x7f800000u, 0x7e00u | ((x >> 13) & 0x3ffu), 0x7c00u);
  // |f| < 2^-14: adding 0.5f puts the 2^-24 unit in the last mantissa place, so
  // the hardware addition itself rounds to nearest even; the mantissa is the result.
  const uint32_t kHalfMagic = 126u << 23;  // 0.5f
  const uint32_t sub = FloatBits(BitsFloat(x) + BitsFloat(kHalfMagic)) - kHalfMagic;
  // Normal range: rebias the exponent, add 0x0fff (+1 when the kept lsb is odd)
  // so dropping 13 bits rounds to nearest even; a carry may bump the exponent.
  const uint32_t odd = (x >> 13) & 1u;
  const uint32_t norm = (x - ((127u - 15u) << 23) + 0x0fffu + odd) >> 13;
  const uint32_t mag = Select(x >= 0x47800000u, big, Select(x < 0x38800000u, sub, norm));
  return static_cast<uint16_t>(mag | (sign >> 16));
}

inline float BFloat16BitsToFloat(uint16_t b) {
  return half_detail::BitsFloat(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = half_detail::FloatBits(f);
  // Round to nearest even on the 16 dropped bits; overflow carries into Inf.
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

}  // namespace hvdlite
