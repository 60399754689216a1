// One pass each for the 1-bit (scaled sign) compressor; see sign_kernels.h. Element i
// belongs to chunk i / chunk and takes that chunk's scale s; its sign is +1.0 where its
// sign bit is 0 and -1.0 where it is 1 (so -0.0 counts as negative). The arithmetic is
// the torch reference's, operation for operation (products by +-1.0 are exact), so the
// results are bit-identical to it.
#include "python/sign_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>

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

// Walks bytes of 8 elements in order: the chunk scale of each of the 8 elements of the
// next byte, without a division in the common case where the 8 lie in one chunk.
class ByteScales {
 public:
  ByteScales(const float* scales, int64_t chunk) : scales_(scales), chunk_(chunk), end_(chunk) {}
  // first: the byte's first element, increasing by 8 from 0 call by call.
  void Next(int64_t first, float* out8) {
    while (first >= end_) {
      ++index_;
      end_ += chunk_;
    }
    if (first + 8 <= end_) {
      for (int b = 0; b < 8; ++b) out8[b] = scales_[index_];
    } else {
      for (int b = 0; b < 8; ++b) out8[b] = scales_[(first + b) / chunk_];
    }
  }

 private:
  const float* scales_;
  int64_t chunk_;
  int64_t index_ = 0;
  int64_t end_;
};

// x[i] = x[i] - s * sign(x[i]) in place, and bit i of bits[i / 8] = signbit(x[i]) (the
// sign read before the update); the bytes past n's last bit up to nbytes are zeroed.
void SignEncode(uintptr_t x_addr, int64_t n, int64_t chunk, uintptr_t scales_addr, uintptr_t bits_addr,
                int64_t nbytes) {
  float* __restrict x = reinterpret_cast<float*>(x_addr);
  const float* __restrict scales = reinterpret_cast<const float*>(scales_addr);
  uint8_t* __restrict bits = reinterpret_cast<uint8_t*>(bits_addr);
  py::gil_scoped_release release;
  std::memset(bits, 0, static_cast<size_t>(nbytes));
  const int64_t whole = n / 8;
  float s8[8];
  ByteScales walk(scales, chunk);
  for (int64_t j = 0; j < whole; ++j) {
    float* v = x + 8 * j;
    walk.Next(8 * j, s8);
    unsigned packed = 0;
    uint32_t word[8];
    std::memcpy(word, v, sizeof(word));  // the sign bit is bit 31, as std::signbit reads it
    for (int b = 0; b < 8; ++b) packed |= (word[b] >> 31) << b;
    const float* sign = kSigns.row[packed];
    for (int b = 0; b < 8; ++b) v[b] = v[b] + (-1.0f * s8[b]) * sign[b];
    bits[j] = static_cast<uint8_t>(packed);
  }
  for (int64_t i = 8 * whole; i < n; ++i) {
    const bool negative = std::signbit(x[i]);
    bits[i >> 3] = static_cast<uint8_t>(bits[i >> 3] | (static_cast<uint8_t>(negative) << (i & 7)));
    x[i] = x[i] + (-1.0f * scales[i / chunk]) * SignOf(negative ? 1u : 0u);
  }
}

// out[i] = s * sign_i (accumulate false) or out[i] + s * sign_i (accumulate true), sign_i
// read from bit i of bits.
template <bool kAccumulate>
void Decode(const uint8_t* __restrict bits, int64_t n, int64_t chunk, const float* __restrict scales,
            float* __restrict out) {
  const int64_t whole = n / 8;
  float s8[8];
  ByteScales walk(scales, chunk);
  for (int64_t j = 0; j < whole; ++j) {
    float* o = out + 8 * j;
    walk.Next(8 * j, s8);
    const float* sign = kSigns.row[bits[j]];
    for (int b = 0; b < 8; ++b) o[b] = kAccumulate ? o[b] + s8[b] * sign[b] : s8[b] * sign[b];
  }
  for (int64_t i = 8 * whole; i < n; ++i) {
    const float sign = SignOf((bits[i >> 3] >> (i & 7)) & 1u);
    out[i] = kAccumulate ? out[i] + scales[i / chunk] * sign : scales[i / chunk] * sign;
  }
}

void SignDecode(uintptr_t bits_addr, int64_t n, int64_t chunk, uintptr_t scales_addr, uintptr_t out_addr,
                bool accumulate) {
  const uint8_t* bits = reinterpret_cast<const uint8_t*>(bits_addr);
  const float* scales = reinterpret_cast<const float*>(scales_addr);
  float* out = reinterpret_cast<float*>(out_addr);
  py::gil_scoped_release release;
  if (accumulate) {
    Decode<true>(bits, n, chunk, scales, out);
  } else {
    Decode<false>(bits, n, chunk, scales, out);
  }
}

}  // namespace

void RegisterSignKernels(py::module_& m) {
  m.def("sign_encode", &SignEncode, py::arg("x"), py::arg("n"), py::arg("chunk"), py::arg("scales"),
        py::arg("bits"), py::arg("nbytes"));
  m.def("sign_decode", &SignDecode, py::arg("bits"), py::arg("n"), py::arg("chunk"), py::arg("scales"),
        py::arg("out"), py::arg("accumulate"));
}

}  // namespace hvdlite_py
