// The core's DataType / ReduceOp as MPI handles.
//
// Built-in types and ops where MPI has them. float16 and bfloat16 are 2-byte
// derived datatypes with user-defined, commutative ops that run the core's
// own kernels (algorithms/reduce_kernels.h), so they round exactly like the
// ring backend. The handles are created once (after MPI is initialized) and
// live until MPI_Finalize.
#pragma once
#include <mpi.h>

#include "common/dtype.h"
#include "common/status.h"

namespace hvdlite {

// Creates the derived types and user ops; idempotent, thread-safe. Call
// after MPI is initialized.
Status InitMpiTypes();

MPI_Datatype ToMpiType(DataType dtype);
// NotSupported for Average/Adasum (the runtime turns Average into Sum) and
// for bool.
Status ToMpiOp(DataType dtype, ReduceOp op, MPI_Op* out);
// True for the dtypes reduced by a user-defined op (float16, bfloat16).
bool UsesUserOp(DataType dtype);

}  // namespace hvdlite
