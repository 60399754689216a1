#include "common/dtype.h"

namespace hvdlite {

bool IsValidDataType(int32_t v) { return v >= 0 && v < kNumDataTypes; }
bool IsValidReduceOp(int32_t v) { return v >= 0 && v <= static_cast<int32_t>(ReduceOp::kAdasum); }

size_t DataTypeSize(DataType dt) {
  switch (dt) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kUInt16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dt) {
  switch (dt) {
    case DataType::kUInt8:
      return "uint8";
    case DataType::kInt8:
      return "int8";
    case DataType::kUInt16:
      return "uint16";
    case DataType::kInt16:
      return "int16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kBool:
      return "bool";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "Sum";
    case ReduceOp::kAverage:
      return "Average";
    case ReduceOp::kMin:
      return "Min";
    case ReduceOp::kMax:
      return "Max";
    case ReduceOp::kProduct:
      return "Product";
    case ReduceOp::kAdasum:
      return "Adasum";
  }
  return "unknown";
}

}  // namespace hvdlite
