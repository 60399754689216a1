// Inputs and straightforward references for reduction tests. Float inputs are
// small integers (or +-0.5, +-1, +-2 for Product) so every partial result is
// exact in every float type, and the reference does not depend on the order of
// reduction. Integer inputs are random bits; the reference wraps in uint64.
#pragma once
#include <cstdint>
#include <vector>

#include "algorithms/reduce_kernels.h"
#include "util.h"

namespace algtest {

inline bool IsFloat(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kBFloat16 || dt == DataType::kFloat32 ||
         dt == DataType::kFloat64;
}

inline double FloatInput(ReduceOp op, int rank, int64_t i) {
  static const double kFactors[] = {-2.0, -1.0, -0.5, 0.5, 1.0, 2.0};
  const uint64_t h = Mix(static_cast<uint64_t>(rank), static_cast<uint64_t>(i), 11);
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<double>(static_cast<int>(h % 17) - 8);
    case ReduceOp::kProduct:
      return kFactors[h % 6];
    default:
      return static_cast<double>(static_cast<int>(h % 201) - 100);
  }
}

inline uint64_t IntInput(int rank, int64_t i) {
  return Mix(static_cast<uint64_t>(rank), static_cast<uint64_t>(i), 7);
}

// Signed (or, for uint8 and uint16, non-negative) value of the integer element `bits`.
inline int64_t IntValue(DataType dt, uint64_t bits) {
  switch (dt) {
    case DataType::kUInt8:
      return static_cast<uint8_t>(bits);
    case DataType::kInt8:
      return static_cast<int8_t>(static_cast<uint8_t>(bits));
    case DataType::kUInt16:
      return static_cast<uint16_t>(bits);
    case DataType::kInt16:
      return static_cast<int16_t>(static_cast<uint16_t>(bits));
    case DataType::kInt32:
      return static_cast<int32_t>(static_cast<uint32_t>(bits));
    default:
      return static_cast<int64_t>(bits);
  }
}

// Writes element i: floats take `fv` (exactly representable), integers the low bits of `iv`.
inline void Put(DataType dt, void* buf, int64_t i, double fv, uint64_t iv) {
  switch (dt) {
    case DataType::kUInt8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(iv);
      break;
    case DataType::kInt8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(iv);
      break;
    case DataType::kUInt16:
    case DataType::kInt16:
      static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(iv);
      break;
    case DataType::kInt32:
      static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(iv);
      break;
    case DataType::kInt64:
      static_cast<uint64_t*>(buf)[i] = iv;
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(buf)[i] = hvdlite::FloatToHalf(static_cast<float>(fv));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = hvdlite::FloatToBFloat16(static_cast<float>(fv));
      break;
    case DataType::kFloat32:
      static_cast<float*>(buf)[i] = static_cast<float>(fv);
      break;
    case DataType::kFloat64:
      static_cast<double*>(buf)[i] = fv;
      break;
    default:
      break;
  }
}

inline std::vector<char> MakeInput(DataType dt, ReduceOp op, int rank, int64_t count) {
  std::vector<char> buf(static_cast<size_t>(count) * hvdlite::DataTypeSize(dt) + 1);
  for (int64_t i = 0; i < count; ++i) Put(dt, buf.data(), i, FloatInput(op, rank, i), IntInput(rank, i));
  return buf;
}

inline double CombineFloat(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return a < b ? a : b;  // the kernels' choice for (-0, +0)
    default:
      return a > b ? a : b;
  }
}

inline uint64_t CombineInt(DataType dt, ReduceOp op, uint64_t a, uint64_t b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;  // low bits wrap like the narrow type
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return IntValue(dt, b) < IntValue(dt, a) ? b : a;
    default:
      return IntValue(dt, b) > IntValue(dt, a) ? b : a;
  }
}

// Element-wise reduction over the given ranks' inputs (rank order irrelevant:
// every partial result is exact, integer arithmetic is modular).
inline std::vector<char> MakeReference(DataType dt, ReduceOp op, const std::vector<int>& ranks, int64_t begin,
                                       int64_t count) {
  std::vector<char> buf(static_cast<size_t>(count) * hvdlite::DataTypeSize(dt) + 1);
  for (int64_t i = 0; i < count; ++i) {
    double fv = FloatInput(op, ranks[0], begin + i);
    uint64_t iv = IntInput(ranks[0], begin + i);
    for (size_t k = 1; k < ranks.size(); ++k) {
      fv = CombineFloat(op, fv, FloatInput(op, ranks[k], begin + i));
      iv = CombineInt(dt, op, iv, IntInput(ranks[k], begin + i));
    }
    Put(dt, buf.data(), i, fv, iv);
  }
  return buf;
}

inline const std::vector<DataType>& ReducibleTypes() {
  static const std::vector<DataType> v = {
      DataType::kUInt8, DataType::kInt8,    DataType::kUInt16,   DataType::kInt16,   DataType::kInt32,
      DataType::kInt64, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64};
  return v;
}

inline const std::vector<ReduceOp>& ReduceOps() {
  static const std::vector<ReduceOp> v = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
  return v;
}

}  // namespace algtest
