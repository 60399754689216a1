// Array conversions between float16 / bfloat16 and float, used by the
// reduction kernels block by block.
//
// The implementation is picked once, at first use, from what the CPU offers:
//  * float16 on x86-64 CPUs with F16C (+AVX): the hardware conversion
//    instructions (8 elements per instruction);
//  * otherwise the portable branch-free loops of half.h, which the compiler
//    vectorizes; on x86-64 Linux they are also compiled for AVX2 and chosen at
//    load time (target_clones).
// Every implementation gives bitwise identical results (half.h matches F16C
// on all 2^32 float inputs and all 2^16 half inputs), so members of a job
// running on different CPUs still agree bit for bit.
#pragma once
#include <cstdint>

namespace hvdlite {
namespace halfblock {

void HalfToFloat(const uint16_t* src, float* dst, int64_t n);
void FloatToHalf(const float* src, uint16_t* dst, int64_t n);
void BFloat16ToFloat(const uint16_t* src, float* dst, int64_t n);
void FloatToBFloat16(const float* src, uint16_t* dst, int64_t n);

// The portable float16 loops, always available (tests compare both).
void HalfToFloatPortable(const uint16_t* src, float* dst, int64_t n);
void FloatToHalfPortable(const float* src, uint16_t* dst, int64_t n);

// "f16c" or "portable": the float16 implementation in use.
const char* HalfImplName();

}  // namespace halfblock
}  // namespace hvdlite
