// Process-wide MPI state shared by the MPI rendezvous and the mpi backend.
// Compiled only in builds with MPI (see CMakeLists.txt); the rest of the core
// reaches it through backend/registry.cc.
#pragma once
#include <mpi.h>

#include <string>

#include "common/status.h"

namespace hvdlite {

// Initializes MPI with MPI_THREAD_MULTIPLE unless it is already initialized
// (by mpi4py or the user). When hvdlite initialized it, MPI_Finalize runs at
// process exit (never earlier: init after shutdown must keep working); when
// someone else did, they finalize it. Fails once MPI has been finalized.
// Thread-safe; cheap after the first call.
Status EnsureMpiInitialized();

// The thread level MPI provided, or -1 before initialization.
int MpiProvidedThreadLevel();

// Turns an MPI error code into a Status naming the call.
Status MpiError(int code, const char* call);

#define HVD_MPI_CALL(call)                                          \
  do {                                                              \
    int _rc = (call);                                               \
    if (_rc != MPI_SUCCESS) return ::hvdlite::MpiError(_rc, #call); \
  } while (0)

}  // namespace hvdlite
