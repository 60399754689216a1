#include "backend/mpi/mpi_types.h"

#include <mutex>

#include "algorithms/reduce_kernels.h"
#include "backend/mpi/mpi_world.h"

namespace hvdlite {
namespace {

MPI_Datatype g_half = MPI_DATATYPE_NULL;
MPI_Datatype g_bfloat = MPI_DATATYPE_NULL;
MPI_Op g_user_ops[2][4];  // [float16, bfloat16][Sum, Min, Max, Product]
std::once_flag g_once;
Status g_init_status;

// MPI's contract: inout[i] = in[i] op inout[i]. ReduceInto computes
// dst[i] = op(dst[i], src[i]); every op here is commutative (widened to
// float, combined, rounded to nearest even), so the two agree bit for bit.
template <DataType D, ReduceOp O>
void HalfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(inout, in, *len, D, O);
}

template <DataType D>
Status CreateOps(MPI_Op* ops) {
  HVD_MPI_CALL(MPI_Op_create(&HalfReduce<D, ReduceOp::kSum>, 1, &ops[0]));
  HVD_MPI_CALL(MPI_Op_create(&HalfReduce<D, ReduceOp::kMin>, 1, &ops[1]));
  HVD_MPI_CALL(MPI_Op_create(&HalfReduce<D, ReduceOp::kMax>, 1, &ops[2]));
  HVD_MPI_CALL(MPI_Op_create(&HalfReduce<D, ReduceOp::kProduct>, 1, &ops[3]));
  return Status::OK();
}

Status CreateAll() {
  // Two distinct types (not MPI_UINT16_T) so a mistaken built-in op on them
  // is an MPI error instead of integer arithmetic on half bits.
  HVD_MPI_CALL(MPI_Type_contiguous(2, MPI_BYTE, &g_half));
  HVD_MPI_CALL(MPI_Type_commit(&g_half));
  HVD_MPI_CALL(MPI_Type_contiguous(2, MPI_BYTE, &g_bfloat));
  HVD_MPI_CALL(MPI_Type_commit(&g_bfloat));
  HVD_RETURN_IF_ERROR(CreateOps<DataType::kFloat16>(g_user_ops[0]));
  return CreateOps<DataType::kBFloat16>(g_user_ops[1]);
}

int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return 0;
    case ReduceOp::kMin:
      return 1;
    case ReduceOp::kMax:
      return 2;
    case ReduceOp::kProduct:
      return 3;
    default:
      return -1;
  }
}

}  // namespace

Status InitMpiTypes() {
  std::call_once(g_once, [] { g_init_status = CreateAll(); });
  return g_init_status;
}

MPI_Datatype ToMpiType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return MPI_UINT8_T;
    case DataType::kInt8:
      return MPI_INT8_T;
    case DataType::kUInt16:
      return MPI_UINT16_T;
    case DataType::kInt16:
      return MPI_INT16_T;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kFloat16:
      return g_half;
    case DataType::kBFloat16:
      return g_bfloat;
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kBool:
      return MPI_C_BOOL;
  }
  return MPI_DATATYPE_NULL;
}

bool UsesUserOp(DataType dtype) { return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16; }

Status ToMpiOp(DataType dtype, ReduceOp op, MPI_Op* out) {
  int index = OpIndex(op);
  if (index < 0 || dtype == DataType::kBool) {
    return Status::NotSupported(std::string("the mpi backend cannot reduce ") + DataTypeName(dtype) +
                                " with " + ReduceOpName(op));
  }
  if (UsesUserOp(dtype)) {
    *out = g_user_ops[dtype == DataType::kFloat16 ? 0 : 1][index];
    return Status::OK();
  }
  static const MPI_Op kBuiltin[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  *out = kBuiltin[index];
  return Status::OK();
}

}  // namespace hvdlite
