// The fused loops of Compression.sign on the CPU (hvdlite/torch/sparse_compressors.py):
// raw float32/uint8 buffers given as addresses; the caller (Python) checks dtype,
// contiguity and sizes and owns every buffer for the call. No blocking, no threads; the
// GIL is released during each loop.
#pragma once

#include <pybind11/pybind11.h>

namespace hvdlite_py {

// Adds sign_encode and sign_decode to the module.
void RegisterSignKernels(pybind11::module_& m);

}  // namespace hvdlite_py
