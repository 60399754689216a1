// DataType and ReduceOp: the element types and reductions the core knows.
// Numeric values are part of the C ABI and mirrored in hvdlite/common/dtypes.py.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace hvdlite {

enum class DataType : int32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kBool = 8,    // broadcast, allgather, alltoall only (no arithmetic)
  kUInt16 = 9,  // appended after kBool: the values above are ABI and never renumbered
  kInt16 = 10,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : int32_t {
  kSum = 0,
  kAverage = 1,  // Sum with postscale 1/size, applied by the runtime
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  kAdasum = 5,  // reserved for the framework adapters; the core rejects it
};

bool IsValidDataType(int32_t v);
bool IsValidReduceOp(int32_t v);
size_t DataTypeSize(DataType dt);
const char* DataTypeName(DataType dt);
const char* ReduceOpName(ReduceOp op);

}  // namespace hvdlite
