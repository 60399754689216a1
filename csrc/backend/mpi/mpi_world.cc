#include "backend/mpi/mpi_world.h"

#include <cstdlib>
#include <mutex>

#include "common/logging.h"

namespace hvdlite {
namespace {

std::mutex g_init_mu;
int g_thread_level = -1;

// Registered with atexit only when hvdlite called MPI_Init_thread. Python's
// atexit handlers (which shut the runtime down) have run by then.
void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

Status MpiError(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return Status::Internal(std::string(call) + " failed: " + std::string(text, len));
}

Status EnsureMpiInitialized() {
  std::lock_guard<std::mutex> lock(g_init_mu);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::Precondition(
        "MPI has already been finalized in this process (MPI.Finalize()?); "
        "hvdlite cannot use MPI any more: restart the process");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    if (g_thread_level < 0) MPI_Query_thread(&g_thread_level);
    return Status::OK();
  }
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Init_thread");
  g_thread_level = provided;
  std::atexit(FinalizeAtExit);
  if (provided < MPI_THREAD_MULTIPLE) {
    HVD_LOG(kDebug, "MPI provides thread level " << provided
                                                 << " (< MPI_THREAD_MULTIPLE): do not call MPI "
                                                    "from other threads while hvdlite runs MPI collectives");
  }
  return Status::OK();
}

int MpiProvidedThreadLevel() {
  std::lock_guard<std::mutex> lock(g_init_mu);
  return g_thread_level;
}

}  // namespace hvdlite
