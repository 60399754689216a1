// One pass each for the 1-bit (scaled sign) compressor; see sign_kernels.h. Element i
// belongs to chunk i / chunk and takes that chunk's scale s; its sign is +1.0 where its
// sign bit is 0 and -1.0 where it is 1 (so -0.0 counts as negative). The arithmetic is
// the torch reference's, operation for operation (products by +-1.0 are exact; the scale
// a chunk's magnitudes summed in one fixed pairwise order, AbsPairwiseSum, that the
// reference computes too, then divided by its length), so the results are bit-identical.
#include "python/sign_kernels.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace py = pybind11;

namespace hvdlite_py {
namespace {

// +1.0 for bit 0, -1.0 for bit 1, computed (exactly) rather than branched on: the bits of
// a gradient are random, and a branch per element mispredicts half the time.
inline float SignOf(unsigned bit) { return 1.0f - 2.0f * static_cast<float>(bit); }

// Row b: the signs (SignOf) of byte b's 8 elements, so that a byte's 8 products are one
// vectorizable loop.
struct SignTable {
  float row[256][8];
  SignTable() {
    for (unsigned byte = 0; byte < 256; ++byte) {
      for (unsigned b = 0; b < 8; ++b) row[byte][b] = SignOf((byte >> b) & 1u);
    }
  }
};
const SignTable kSigns;

// The sum of |v[0]|, ..., |v[len - 1]| (len >= 1) in the one order the reference
// (sparse_compressors.chunk_abs_means) computes with torch, so that both give the same bits:
// pairwise by halves, float32 throughout. A level of length L becomes one of length
// L / 2 + L % 2: w[i] = u[i] + u[i + L / 2] for i < L / 2, then (L odd) u[L - 1] carried
// as the last element; until one element is left. buf holds len / 2 + 1 floats.
float AbsPairwiseSum(const float* __restrict v, int64_t len, float* buf) {
  if (len == 1) return std::fabs(v[0]);
  int64_t half = len / 2;
  for (int64_t i = 0; i < half; ++i) buf[i] = std::fabs(v[i]) + std::fabs(v[i + half]);
  if (len & 1) buf[half] = std::fabs(v[2 * half]);
  len = half + (len & 1);
  while (len > 1) {
    half = len / 2;
    float* __restrict low = buf;
    const float* __restrict high = buf + half;  // [half, 2 half): disjoint from [0, half)
    for (int64_t i = 0; i < half; ++i) low[i] = low[i] + high[i];
    if (len & 1) buf[half] = buf[2 * half];
    len = half + (len & 1);
  }
  return buf[0];
}

// Sets bit i % 8 of bits[i / 8] to signbit(x[i]) for i in [begin, end) (bits start at
// zero: a byte two calls share gets its bits from both). Whole bytes with a movemask.
void PackSigns(const float* x, int64_t begin, int64_t end, uint8_t* bits) {
  int64_t i = begin;
  for (; i < end && (i & 7) != 0; ++i) bits[i >> 3] |= static_cast<uint8_t>(std::signbit(x[i]) << (i & 7));
  const int64_t whole_end = i + ((end - i) & ~int64_t{7});
  for (; i < whole_end; i += 8) {
#if defined(__SSE2__)
    const int low = _mm_movemask_ps(_mm_loadu_ps(x + i));
    const int high = _mm_movemask_ps(_mm_loadu_ps(x + i + 4));
    bits[i >> 3] = static_cast<uint8_t>(low | (high << 4));
#else
    uint32_t word[8];
    std::memcpy(word, x + i, sizeof(word));  // the sign bit is bit 31, as std::signbit reads it
    unsigned packed = 0;
    for (int b = 0; b < 8; ++b) packed |= (word[b] >> 31) << b;
    bits[i >> 3] = static_cast<uint8_t>(packed);
#endif
  }
  for (; i < end; ++i) bits[i >> 3] |= static_cast<uint8_t>(std::signbit(x[i]) << (i & 7));
}

// x[i] = x[i] - copysign(s, x[i]) for i in [begin, end): the reference's
// x + (-1.0 * s) * sign exactly (x - s and x + (-s) are the same IEEE operation).
void SubtractSigned(float* __restrict x, int64_t begin, int64_t end, float s) {
  for (int64_t i = begin; i < end; ++i) x[i] = x[i] - std::copysign(s, x[i]);
}

// x[i] for i in [begin, end): residual[i] + grad[i] (both given), grad[i] (no residual),
// or left as it is (no gradient: x already holds gradient + residual). x may be residual.
void Correct(const float* grad, const float* residual, float* x, int64_t begin, int64_t end) {
  if (grad == nullptr) return;
  if (residual == nullptr) {
    std::memcpy(x + begin, grad + begin, static_cast<size_t>(end - begin) * sizeof(float));
    return;
  }
  for (int64_t i = begin; i < end; ++i) x[i] = residual[i] + grad[i];
}

// One pass over memory, chunk by chunk (a chunk stays in cache between its three steps):
// x = gradient + residual (Correct), the chunk's scale (its mean magnitude,
// AbsPairwiseSum / length), then the sign bits of x packed into bits and the new residual
// x - s * sign(x) left in x. bits: nbytes (n's bits, the rest zeroed); scales: one float
// per chunk, written.
void SignEncode(uintptr_t grad_addr, uintptr_t residual_addr, uintptr_t x_addr, int64_t n, int64_t chunk,
                uintptr_t scales_addr, uintptr_t bits_addr, int64_t nbytes) {
  const float* grad = reinterpret_cast<const float*>(grad_addr);
  const float* residual = reinterpret_cast<const float*>(residual_addr);
  float* x = reinterpret_cast<float*>(x_addr);
  float* scales = reinterpret_cast<float*>(scales_addr);
  uint8_t* bits = reinterpret_cast<uint8_t*>(bits_addr);
  py::gil_scoped_release release;
  std::memset(bits, 0, static_cast<size_t>(nbytes));
  std::vector<float> buf(static_cast<size_t>(std::min(chunk, n) / 2 + 1));
  for (int64_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
    const int64_t end = std::min(begin + chunk, n);
    Correct(grad, residual, x, begin, end);
    scales[c] = AbsPairwiseSum(x + begin, end - begin, buf.data()) / static_cast<float>(end - begin);
    PackSigns(x, begin, end, bits);  // the signs before the residual changes them
    SubtractSigned(x, begin, end, scales[c]);
  }
}

// out[i] = s * sign_i (kAccumulate false) or out[i] + s * sign_i (true) for i in
// [begin, end), sign_i read from bit i % 8 of bits[i / 8]. Whole bytes by the table.
template <bool kAccumulate>
void DecodeRange(const uint8_t* __restrict bits, float s, int64_t begin, int64_t end, float* __restrict out) {
  auto one = [&](int64_t i) {
    const float value = s * SignOf((bits[i >> 3] >> (i & 7)) & 1u);
    out[i] = kAccumulate ? out[i] + value : value;
  };
  int64_t i = begin;
  for (; i < end && (i & 7) != 0; ++i) one(i);
  const int64_t whole_end = i + ((end - i) & ~int64_t{7});
#if defined(__SSE2__)
  const __m128 scale = _mm_set1_ps(s);  // the same products and sums, 4 at a time
  for (; i < whole_end; i += 8) {
    const float* sign = kSigns.row[bits[i >> 3]];
    __m128 low = _mm_mul_ps(scale, _mm_loadu_ps(sign));
    __m128 high = _mm_mul_ps(scale, _mm_loadu_ps(sign + 4));
    if (kAccumulate) {
      low = _mm_add_ps(_mm_loadu_ps(out + i), low);
      high = _mm_add_ps(_mm_loadu_ps(out + i + 4), high);
    }
    _mm_storeu_ps(out + i, low);
    _mm_storeu_ps(out + i + 4, high);
  }
#else
  for (; i < whole_end; i += 8) {
    const float* sign = kSigns.row[bits[i >> 3]];
    float* o = out + i;
    for (int b = 0; b < 8; ++b) o[b] = kAccumulate ? o[b] + s * sign[b] : s * sign[b];
  }
#endif
  for (; i < end; ++i) one(i);
}

// out = (out +) the ranks' scales x signs in rank order: out[i] = s0 sign0_i + s1 sign1_i
// + ..., summed left to right (out[i] first when accumulate), as the reference's decodes
// one rank after the other give it. Chunk by chunk, so out stays in cache across ranks.
void SignDecode(const std::vector<uintptr_t>& bits_addrs, const std::vector<uintptr_t>& scales_addrs,
                int64_t n, int64_t chunk, uintptr_t out_addr, bool accumulate) {
  if (bits_addrs.size() != scales_addrs.size() || bits_addrs.empty()) {
    throw py::value_error("sign_decode: one bits and one scales address per rank, at least one rank");
  }
  float* out = reinterpret_cast<float*>(out_addr);
  py::gil_scoped_release release;
  for (int64_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
    const int64_t end = std::min(begin + chunk, n);
    for (size_t r = 0; r < bits_addrs.size(); ++r) {
      const uint8_t* bits = reinterpret_cast<const uint8_t*>(bits_addrs[r]);
      const float s = reinterpret_cast<const float*>(scales_addrs[r])[c];
      if (r == 0 && !accumulate) {
        DecodeRange<false>(bits, s, begin, end, out);
      } else {
        DecodeRange<true>(bits, s, begin, end, out);
      }
    }
  }
}

}  // namespace

void RegisterSignKernels(py::module_& m) {
  m.def("sign_encode", &SignEncode, py::arg("grad"), py::arg("residual"), py::arg("x"), py::arg("n"),
        py::arg("chunk"), py::arg("scales"), py::arg("bits"), py::arg("nbytes"));
  m.def("sign_decode", &SignDecode, py::arg("bits"), py::arg("scales"), py::arg("n"), py::arg("chunk"),
        py::arg("out"), py::arg("accumulate"));
}

}  // namespace hvdlite_py
