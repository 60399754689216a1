// Unit tests of the reduction kernels and half/bfloat16 conversions, against
// slow, obviously correct references written with frexp/ldexp/nearbyint.
#pragma once
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "algorithms/half_block.h"
#include "algorithms/reduce_kernels.h"
#include "util.h"
#include "values.h"

namespace algtest {

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline double RefHalfToDouble(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  return e == 0 ? s * std::ldexp(m, -24) : s * std::ldexp(1024 + m, e - 25);
}

// Rounds |x| to `mant_bits` fraction bits, exponent >= min_exp (subnormals
// below); returns +-Inf when it reaches 2^(max_exp+1). NaN not handled.
inline double RefRound(double x, int mant_bits, int min_exp, int max_exp) {
  const double a = std::fabs(x);
  if (a == 0) return x;
  int e;
  std::frexp(a, &e);
  const int E = std::max(e - 1, min_exp);
  const double ulp = std::ldexp(1.0, E - mant_bits);
  const double v = std::nearbyint(a / ulp) * ulp;  // ties to even (default mode)
  const double r = v >= std::ldexp(1.0, max_exp + 1) ? INFINITY : v;
  return std::signbit(x) ? -r : r;
}

// Correctly rounded double -> half bits (non-NaN input).
inline uint16_t RefDoubleToHalf(double x) {
  const double v = RefRound(x, 10, -14, 15);
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(a / std::ldexp(1.0, -24));
  int e;
  std::frexp(a, &e);
  const int m = static_cast<int>(a / std::ldexp(1.0, e - 1) * 1024 - 1024);
  return sign | static_cast<uint16_t>(((e - 1 + 15) << 10) | m);
}

// Correctly rounded double -> bfloat16 bits (non-NaN input).
inline uint16_t RefDoubleToBFloat16(double x) {
  const double v = RefRound(x, 7, -126, 127);
  return static_cast<uint16_t>(Bits(static_cast<float>(v)) >> 16);
}

inline void CheckEncode(float f) {
  if (std::isnan(f)) {
    Check().Expect(std::isnan(hvdlite::HalfToFloat(hvdlite::FloatToHalf(f))), "half NaN");
    Check().Expect(std::isnan(hvdlite::BFloat16ToFloat(hvdlite::FloatToBFloat16(f))), "bf16 NaN");
    return;
  }
  const uint16_t h = hvdlite::FloatToHalf(f), rh = RefDoubleToHalf(f);
  const uint16_t b = hvdlite::FloatToBFloat16(f), rb = RefDoubleToBFloat16(f);
  if (h != rh)
    Check().Fail("FloatToHalf(" + std::to_string(f) + " bits " + std::to_string(Bits(f)) +
                 ") = " + std::to_string(h) + " want " + std::to_string(rh));
  if (b != rb)
    Check().Fail("FloatToBFloat16(bits " + std::to_string(Bits(f)) + ") = " + std::to_string(b) + " want " +
                 std::to_string(rb));
}

// Every half pattern decodes exactly and round-trips; values next to every
// rounding boundary of both formats, and many random floats, encode like the reference.
inline void TestConversions() {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = hvdlite::HalfToFloat(static_cast<uint16_t>(h));
    const double want = RefHalfToDouble(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      Check().Expect(std::isnan(f), "HalfToFloat NaN " + std::to_string(h));
      continue;
    }
    Check().Expect(static_cast<double>(f) == want && std::signbit(f) == std::signbit(want),
                   "HalfToFloat " + std::to_string(h));
    Check().Expect(hvdlite::FloatToHalf(f) == h, "half round trip " + std::to_string(h));
    const float fb = hvdlite::BFloat16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(fb))
      Check().Expect(hvdlite::FloatToBFloat16(fb) == h, "bf16 round trip " + std::to_string(h));
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // boundaries: each value, midpoints and neighbours
    for (int fmt = 0; fmt < 2; ++fmt) {
      const float x = fmt ? hvdlite::BFloat16ToFloat(static_cast<uint16_t>(h))
                          : hvdlite::HalfToFloat(static_cast<uint16_t>(h));
      const float y = fmt ? hvdlite::BFloat16ToFloat(static_cast<uint16_t>(h + 1))
                          : hvdlite::HalfToFloat(static_cast<uint16_t>(h + 1));
      const float mid = static_cast<float>((static_cast<double>(x) + y) / 2);
      for (float v : {x, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        CheckEncode(v);
        CheckEncode(-v);
      }
    }
  }
  for (uint64_t i = 0; i < 4000000; ++i) {
    uint32_t u = static_cast<uint32_t>(Mix(i, 99));
    if (i % 2) u = (u & 0x807fffffu) | ((100u + (u >> 23) % 60u) << 23);  // exponents near half's range
    CheckEncode(FromBits(u));
  }
  for (float v : {65504.0f, 65519.99f, 65520.0f, 1e9f, INFINITY, 3.4e38f, 1e-8f, 1e-45f, 0.0f}) {
    CheckEncode(v);
    CheckEncode(-v);
  }
  Check().Expect(hvdlite::FloatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3c00, "1+2^-11 ties to 1");
  Check().Expect(hvdlite::FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02,
                 "1+3*2^-11 ties up to even");
  Check().Expect(hvdlite::FloatToHalf(65520.0f) == 0x7c00, "65520 -> inf");
  Check().Expect(hvdlite::FloatToHalf(std::ldexp(1.0f, -25)) == 0x0000, "2^-25 ties to 0");
  Check().Expect(hvdlite::FloatToHalf(3 * std::ldexp(1.0f, -25)) == 0x0002, "3*2^-25 ties to 2 ulp");
  Check().Expect(hvdlite::FloatToHalf(-0.0f) == 0x8000, "-0");
  Check().Expect(hvdlite::FloatToBFloat16(FromBits(0x3f808000u)) == 0x3f80, "bf16 tie to even");
  Check().Expect(hvdlite::FloatToBFloat16(FromBits(0x3f818000u)) == 0x3f82, "bf16 tie up to even");
  Check().Expect(hvdlite::FloatToBFloat16(FromBits(0x7f7fffffu)) == 0x7f80, "bf16 overflow -> inf");
  Check().Expect((hvdlite::FloatToBFloat16(FromBits(0xffc00001u)) & 0x7fc0) == 0x7fc0, "bf16 NaN stays NaN");
}

// Value of a float element given its bits.
inline double BitsToDouble(DataType dt, uint64_t x) {
  if (dt == DataType::kFloat16) return RefHalfToDouble(static_cast<uint16_t>(x));
  if (dt == DataType::kBFloat16) return FromBits(static_cast<uint32_t>(x) << 16);
  if (dt == DataType::kFloat32) return FromBits(static_cast<uint32_t>(x));
  double d;
  std::memcpy(&d, &x, 8);
  return d;
}

// Reference for one element of ReduceInto (bits in, bits out), computed in double.
inline uint64_t RefReduce(DataType dt, ReduceOp op, uint64_t a, uint64_t b, bool* is_nan) {
  *is_nan = false;
  if (!IsFloat(dt)) return CombineInt(dt, op, a, b);
  const double x = BitsToDouble(dt, a), y = BitsToDouble(dt, b);
  double r = CombineFloat(op, x, y);
  if (op == ReduceOp::kSum && dt == DataType::kFloat32) r = static_cast<float>(x) + static_cast<float>(y);
  if (op == ReduceOp::kProduct && dt == DataType::kFloat32) r = static_cast<float>(x) * static_cast<float>(y);
  if (op == ReduceOp::kSum && dt == DataType::kFloat64) r = x + y;
  if (std::isnan(x) || std::isnan(y) || std::isnan(r)) {
    *is_nan = true;
    return 0;
  }
  switch (dt) {
    case DataType::kFloat16:
      return RefDoubleToHalf(r);
    case DataType::kBFloat16:
      return RefDoubleToBFloat16(r);
    case DataType::kFloat32:
      return Bits(static_cast<float>(r));
    default: {
      uint64_t u;
      std::memcpy(&u, &r, 8);
      return u;
    }
  }
}

inline uint64_t Load(DataType dt, const std::vector<char>& buf, int64_t i) {
  uint64_t u = 0;
  const size_t es = hvdlite::DataTypeSize(dt);
  std::memcpy(&u, buf.data() + i * es, es);
  return u;
}

// Random floats in [-1000, 1000] with a NaN now and then.
inline void FillRandom(DataType dt, std::vector<char>* buf, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = Mix(seed, static_cast<uint64_t>(i));
    double f = (static_cast<double>(h % 2000001) - 1000000.0) / 997.0;
    if (i % 97 == static_cast<int64_t>(seed % 7)) f = std::numeric_limits<double>::quiet_NaN();
    Put(dt, buf->data(), i, dt == DataType::kFloat64 ? f : static_cast<float>(f), h);
  }
}

// ReduceInto on 1000 elements (several 256-element blocks plus a tail) of
// every dtype and op, element by element against RefReduce.
inline void TestReduceInto() {
  const int64_t n = 1000;
  for (DataType dt : ReducibleTypes()) {
    for (ReduceOp op : ReduceOps()) {
      const size_t es = hvdlite::DataTypeSize(dt);
      std::vector<char> a(n * es), b(n * es);
      FillRandom(dt, &a, n, 1);
      FillRandom(dt, &b, n, 2);
      std::vector<char> out = a;
      if (!Check().ExpectOk(hvdlite::ReduceInto(out.data(), b.data(), n, dt, op), "ReduceInto")) continue;
      int bad = 0;
      for (int64_t i = 0; i < n && bad < 3; ++i) {
        bool nan = false;
        const uint64_t want = RefReduce(dt, op, Load(dt, a, i), Load(dt, b, i), &nan);
        const uint64_t got = Load(dt, out, i);
        const uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
        const bool ok = nan ? std::isnan(BitsToDouble(dt, got)) : (want & mask) == got;
        if (!ok) {
          ++bad;
          Check().Fail(Where("ReduceInto", 1, 0, dt, op, n) + " element " + std::to_string(i));
        }
      }
    }
  }
}

template <typename T>
inline T ReduceOne(T a, T b, DataType dt, ReduceOp op) {
  Check().ExpectOk(hvdlite::ReduceInto(&a, &b, 1, dt, op), "ReduceInto scalar");
  return a;
}

// Wrapping integer arithmetic, float16 rounding of sums, ScaleBuffer, and the
// NotSupported cases.
inline void TestScalarCases() {
  using L64 = std::numeric_limits<int64_t>;
  using L32 = std::numeric_limits<int32_t>;
  Check().Expect(ReduceOne<int8_t>(127, 1, DataType::kInt8, ReduceOp::kSum) == -128, "int8 127+1");
  Check().Expect(ReduceOne<uint8_t>(200, 100, DataType::kUInt8, ReduceOp::kSum) == 44, "uint8 200+100");
  Check().Expect(ReduceOne<uint8_t>(16, 17, DataType::kUInt8, ReduceOp::kProduct) == 16, "uint8 16*17");
  Check().Expect(ReduceOne<int8_t>(-128, -1, DataType::kInt8, ReduceOp::kProduct) == -128, "int8 -128*-1");
  Check().Expect(ReduceOne<int32_t>(L32::max(), 1, DataType::kInt32, ReduceOp::kSum) == L32::min(),
                 "int32 max+1");
  Check().Expect(ReduceOne<int64_t>(L64::max(), 1, DataType::kInt64, ReduceOp::kSum) == L64::min(),
                 "int64 max+1");
  Check().Expect(ReduceOne<int64_t>(L64::min(), -1, DataType::kInt64, ReduceOp::kProduct) == L64::min(),
                 "int64 min*-1");
  Check().Expect(ReduceOne<uint16_t>(65535, 65535, DataType::kUInt16, ReduceOp::kProduct) == 1,
                 "uint16 65535*65535 (no int promotion overflow)");
  Check().Expect(ReduceOne<uint16_t>(65535, 2, DataType::kUInt16, ReduceOp::kSum) == 1, "uint16 65535+2");
  Check().Expect(ReduceOne<int16_t>(300, 300, DataType::kInt16, ReduceOp::kProduct) == 24464,
                 "int16 300*300");
  Check().Expect(ReduceOne<int16_t>(-5, 3, DataType::kInt16, ReduceOp::kMin) == -5, "int16 min is signed");
  Check().Expect(ReduceOne<uint16_t>(60000, 3, DataType::kUInt16, ReduceOp::kMax) == 60000,
                 "uint16 max is unsigned");
  Check().Expect(ReduceOne<int32_t>(-5, 3, DataType::kInt32, ReduceOp::kMin) == -5, "int32 min");
  Check().Expect(ReduceOne<int8_t>(-5, 3, DataType::kInt8, ReduceOp::kMax) == 3, "int8 max");
  Check().Expect(ReduceOne<uint8_t>(250, 3, DataType::kUInt8, ReduceOp::kMax) == 250,
                 "uint8 max is unsigned");
  auto h = [](float f) { return hvdlite::FloatToHalf(f); };
  Check().Expect(ReduceOne<uint16_t>(h(2048), h(1), DataType::kFloat16, ReduceOp::kSum) == h(2048),
                 "f16 2048+1");
  Check().Expect(ReduceOne<uint16_t>(h(2048), h(3), DataType::kFloat16, ReduceOp::kSum) == h(2052),
                 "f16 2048+3");
  Check().Expect(ReduceOne<uint16_t>(h(60000), h(10000), DataType::kFloat16, ReduceOp::kSum) == 0x7c00,
                 "f16 overflow");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Check().Expect(std::isnan(ReduceOne<float>(1.0f, nan, DataType::kFloat32, ReduceOp::kMin)), "min(1, NaN)");
  Check().Expect(std::isnan(ReduceOne<float>(nan, 1.0f, DataType::kFloat32, ReduceOp::kMax)), "max(NaN, 1)");

  int32_t i32[3] = {7, -7, 100};
  Check().ExpectOk(hvdlite::ScaleBuffer(i32, 3, DataType::kInt32, 0.5), "ScaleBuffer int32");
  Check().Expect(i32[0] == 3 && i32[1] == -3 && i32[2] == 50, "int32 scale truncates toward zero");
  int8_t i8[2] = {100, -100};
  Check().ExpectOk(hvdlite::ScaleBuffer(i8, 2, DataType::kInt8, 3.0), "ScaleBuffer int8");
  Check().Expect(i8[0] == 127 && i8[1] == -128, "int8 scale saturates");
  uint16_t f16[2] = {h(3), h(-5)};
  Check().ExpectOk(hvdlite::ScaleBuffer(f16, 2, DataType::kFloat16, 0.5), "ScaleBuffer f16");
  Check().Expect(f16[0] == h(1.5f) && f16[1] == h(-2.5f), "f16 scale");
  uint16_t bf[1] = {hvdlite::FloatToBFloat16(6.0f)};
  Check().ExpectOk(hvdlite::ScaleBuffer(bf, 1, DataType::kBFloat16, 0.25), "ScaleBuffer bf16");
  Check().Expect(bf[0] == hvdlite::FloatToBFloat16(1.5f), "bf16 scale");
  float f32[2] = {1.0f, 3.0f};
  Check().ExpectOk(hvdlite::ScaleBuffer(f32, 2, DataType::kFloat32, 1.0 / 3.0), "ScaleBuffer f32");
  Check().Expect(f32[0] == static_cast<float>(1.0 / 3.0) && f32[1] == 1.0f, "f32 scale");
  float f32b[1] = {9.0f};  // Horovod: float(0.1) * 9 in float = 0.90000004, not float(0.1 * 9) = 0.9
  Check().ExpectOk(hvdlite::ScaleBuffer(f32b, 1, DataType::kFloat32, 0.1), "ScaleBuffer f32 0.1");
  Check().Expect(f32b[0] == 0.1f * 9.0f && f32b[0] != 0.9f, "f32 scale rounds the factor to float first");
  int16_t i16[2] = {-7, 30000};
  Check().ExpectOk(hvdlite::ScaleBuffer(i16, 2, DataType::kInt16, 1.5), "ScaleBuffer int16");
  Check().Expect(i16[0] == -10 && i16[1] == 32767, "int16 scale truncates and saturates");
  uint16_t u16[1] = {65535};
  Check().ExpectOk(hvdlite::ScaleBuffer(u16, 1, DataType::kUInt16, 0.5), "ScaleBuffer uint16");
  Check().Expect(u16[0] == 32767, "uint16 scale");
  double f64[1] = {10.0};
  Check().ExpectOk(hvdlite::ScaleBuffer(f64, 1, DataType::kFloat64, 0.1), "ScaleBuffer f64");
  Check().Expect(f64[0] == 10.0 * 0.1, "f64 scale");

  char b[4] = {1, 0, 1, 0};
  Check().Expect(hvdlite::ReduceInto(b, b + 2, 2, DataType::kBool, ReduceOp::kSum).code() ==
                     hvdlite::StatusCode::kNotSupported,
                 "bool reduce NotSupported");
  Check().Expect(
      hvdlite::ScaleBuffer(b, 2, DataType::kBool, 2.0).code() == hvdlite::StatusCode::kNotSupported,
      "bool scale NotSupported");
  Check().Expect(hvdlite::ReduceInto(f32, f32 + 1, 1, DataType::kFloat32, ReduceOp::kAdasum).code() ==
                     hvdlite::StatusCode::kNotSupported,
                 "Adasum NotSupported");
  Check().Expect(hvdlite::ReduceInto(f32, f32 + 1, 1, DataType::kFloat32, ReduceOp::kAverage).code() ==
                     hvdlite::StatusCode::kNotSupported,
                 "Average in a kernel NotSupported");
}

// The dispatched block conversions (F16C where available) agree bit for bit
// with the portable loops and the scalar functions: every half pattern, and
// a stride-257 sweep of all 2^32 float patterns.
inline void TestBlockConversions() {
  namespace hb = hvdlite::halfblock;
  std::vector<uint16_t> h(65536), x(65536), y(65536);
  std::vector<float> a(65536), b(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  hb::HalfToFloat(h.data(), a.data(), 65536);
  hb::HalfToFloatPortable(h.data(), b.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    if (Bits(a[i]) != Bits(b[i]) || Bits(a[i]) != Bits(hvdlite::HalfToFloat(h[i]))) {
      Check().Fail("half widen differs for " + std::to_string(i) + " (" + hb::HalfImplName() + ")");
      break;
    }
  }
  const uint64_t kStride = 257, kChunk = 65536;
  for (uint64_t start = 0; start < (1ull << 32) && Check().count() == 0; start += kChunk * kStride) {
    for (uint64_t i = 0; i < kChunk; ++i) a[i] = FromBits(static_cast<uint32_t>(start + i * kStride));
    hb::FloatToHalf(a.data(), x.data(), kChunk);
    hb::FloatToHalfPortable(a.data(), y.data(), kChunk);
    for (uint64_t i = 0; i < kChunk; ++i) {
      if (x[i] != y[i] || x[i] != hvdlite::FloatToHalf(a[i])) {
        Check().Fail("half narrow differs for float bits " + std::to_string(Bits(a[i])));
        break;
      }
    }
    hb::FloatToBFloat16(a.data(), x.data(), kChunk);
    for (uint64_t i = 0; i < kChunk; ++i) {
      if (x[i] != hvdlite::FloatToBFloat16(a[i])) {
        Check().Fail("bf16 narrow differs for float bits " + std::to_string(Bits(a[i])));
        break;
      }
    }
  }
}

}  // namespace algtest
