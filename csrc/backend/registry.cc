// The one place that knows which backends this build has. HAVE_MPI is set
// by CMakeLists.txt when it found MPI and compiled csrc/backend/mpi/.
#include <string>

#include "algorithms/reduce_kernels.h"
#include "transport/transport.h"

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

std::unique_ptr<Backend> NewSplitBackend(std::unique_ptr<Backend> small, std::unique_ptr<Backend> large,
                                         int64_t threshold_bytes);

// auto: from this size up, MPI beat the ring in every run under mpirun on
// one host; below it the two were within run-to-run noise, the ring slightly
// ahead for broadcast (docs/mpi_and_cuda.md, benchmarks/_mpi_path.py).
constexpr int64_t kAutoMpiFromBytes = 64 << 10;

Status CreateCpuBackend(const Config& cfg, Transport* transport, std::unique_ptr<Backend>* out) {
  const std::string& want = cfg.CPU_OPERATIONS;
  if (want == "ring" || want == "gloo") {
    *out = NewRingBackend(transport);
    return Status::OK();
  }
#if HAVE_MPI
  if (want == "mpi") return CreateMpiBackendImpl(transport, out);
  const bool formed_by_mpi = cfg.RANK < 0 && cfg.SIZE < 0 && cfg.mpi_launch.active();
  if ((want == "auto" || want.empty()) && formed_by_mpi && transport->size() > 1) {
    std::unique_ptr<Backend> mpi;
    if (CreateMpiBackendImpl(transport, &mpi).ok()) {
      *out = NewSplitBackend(NewRingBackend(transport), std::move(mpi), kAutoMpiFromBytes);
      return Status::OK();
    }
  }
  const char* available = "auto, ring, mpi";
#else
  const char* available = "auto, ring (rebuild with Open MPI installed for mpi)";
#endif
  if (want == "auto" || want.empty()) {
    *out = NewRingBackend(transport);
    return Status::OK();
  }
  return Status::NotSupported("HVDLITE_CPU_OPERATIONS=" + want +
                              " is not available in this build; available: " + available);
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
