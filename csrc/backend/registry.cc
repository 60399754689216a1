// The one place that knows which backends this build has. HAVE_MPI is set
// by CMakeLists.txt when it found MPI and compiled csrc/backend/mpi/.
#include <string>

#include "backend/backend.h"

namespace hvdlite {

std::unique_ptr<Backend> NewRingBackend(Transport* transport);

#if HAVE_MPI
Status CreateMpiBackendImpl(Transport* transport, std::unique_ptr<Backend>* out);
Status MpiRendezvousImpl(double timeout_s, MpiJob* out);
int MpiProvidedThreadLevel();
#endif

std::vector<const char*> BuiltBackends() {
#if HAVE_MPI
  return {"ring", "mpi"};
#else
  return {"ring"};
#endif
}

Status CreateCpuBackend(const Config& cfg, Transport* transport, std::unique_ptr<Backend>* out) {
  const std::string& want = cfg.CPU_OPERATIONS;
  if (want == "ring" || want == "gloo" || want.empty()) {
    *out = NewRingBackend(transport);
    return Status::OK();
  }
#if HAVE_MPI
  if (want == "mpi") return CreateMpiBackendImpl(transport, out);
  const char* available = "ring, mpi";
#else
  const char* available = "ring (rebuild with Open MPI installed for mpi)";
#endif
  return Status::NotSupported("HVDLITE_CPU_OPERATIONS=" + want + " is not available in this build; available: " +
                              available);
}

bool MpiBuilt() {
#if HAVE_MPI
  return true;
#else
  return false;
#endif
}

Status MpiRendezvous(double timeout_s, MpiJob* out) {
#if HAVE_MPI
  return MpiRendezvousImpl(timeout_s, out);
#else
  *out = MpiJob{};
  return Status::NotSupported(
      "this process was started by mpirun, but this build of hvdlite has no MPI support: install Open MPI "
      "(libopenmpi-dev) and rebuild (`make install`), or launch with `hvdliterun -np N`");
#endif
}

int MpiThreadLevel() {
#if HAVE_MPI
  return MpiProvidedThreadLevel();
#else
  return -1;
#endif
}

}  // namespace hvdlite
