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

// x[i] = x[i] - s * sign(x[i]) in place, and bit i of bits[i / 8] = signbit(x[i]) (the
// sign read before the update); the bytes past n's last bit up to nbytes are zeroed.
void SignEncode(uintptr_t x_addr, int64_t n, int64_t chunk, uintptr_t scales_addr, uintptr_t bits_addr,
                int64_t nbytes) {
  float* x = reinterpret_cast<float*>(x_addr);
  const float* scales = reinterpret_cast<const float*>(scales_addr);
  uint8_t* bits = reinterpret_cast<uint8_t*>(bits_addr);
  py::gil_scoped_release release;
  std::memset(bits, 0, static_cast<size_t>(nbytes));
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t end = start + chunk < n ? start + chunk : n;
    const float minus_s = -1.0f * scales[start / chunk];
    for (int64_t i = start; i < end; ++i) {
      const bool negative = std::signbit(x[i]);
      bits[i >> 3] |= static_cast<uint8_t>(static_cast<uint8_t>(negative) << (i & 7));
      x[i] = x[i] + minus_s * (negative ? -1.0f : 1.0f);
    }
  }
}

// out[i] = s * sign_i (accumulate false) or out[i] + s * sign_i (accumulate true), sign_i
// read from bit i of bits.
void SignDecode(uintptr_t bits_addr, int64_t n, int64_t chunk, uintptr_t scales_addr, uintptr_t out_addr,
                bool accumulate) {
  const uint8_t* bits = reinterpret_cast<const uint8_t*>(bits_addr);
  const float* scales = reinterpret_cast<const float*>(scales_addr);
  float* out = reinterpret_cast<float*>(out_addr);
  py::gil_scoped_release release;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t end = start + chunk < n ? start + chunk : n;
    const float s = scales[start / chunk];
    for (int64_t i = start; i < end; ++i) {
      const float sign = (bits[i >> 3] >> (i & 7)) & 1 ? -1.0f : 1.0f;
      out[i] = accumulate ? out[i] + s * sign : s * sign;
    }
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
