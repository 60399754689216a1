// The one place that knows which backends this build has. HAVE_MPI is set
// by CMakeLists.txt when it found MPI and compiled csrc/backend/mpi/.
#include <string>

#include "algorithms/reduce_kernels.h"
#include "backend/split_backend.h"
#include "transport/transport.h"

namespace hvdlite {

std::unique_ptr<Backend> NewRingBackend(Transport* transport, std::vector<int> host_of, int hierarchical,
                                        int hierarchical_allgather);

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

Status ParseCpuOperations(const std::string& text, CpuOperations* out) {
  if (text == "auto" || text.empty()) {
    *out = CpuOperations::kAuto;
  } else if (text == "ring" || text == "gloo") {
    *out = CpuOperations::kRing;
  } else if (text == "mpi") {
    *out = CpuOperations::kMpi;
  } else {
    return Status::InvalidArgument("HVDLITE_CPU_OPERATIONS=" + text +
                                   " is not a CPU backend; use auto, ring or mpi");
  }
  return Status::OK();
}

Status CreateCpuBackend(const Config& cfg, Transport* transport, const std::vector<int>& host_of,
                        std::unique_ptr<Backend>* out) {
  auto ring = [&] {
    return NewRingBackend(transport, host_of, static_cast<int>(cfg.HIERARCHICAL_ALLREDUCE),
                          static_cast<int>(cfg.HIERARCHICAL_ALLGATHER));
  };
  CpuOperations want;
  HVD_RETURN_IF_ERROR(ParseCpuOperations(cfg.CPU_OPERATIONS, &want));
  if (want == CpuOperations::kRing) {
    *out = ring();
    return Status::OK();
  }
#if HAVE_MPI
  if (want == CpuOperations::kMpi) return CreateMpiBackendImpl(transport, out);
  const bool formed_by_mpi = cfg.RANK < 0 && cfg.SIZE < 0 && cfg.mpi_launch.active();
  if (formed_by_mpi && transport->size() > 1 && kMeasuredAutoTable.AnyMpi()) {
    std::unique_ptr<Backend> mpi;
    if (CreateMpiBackendImpl(transport, &mpi).ok()) {
      *out = NewSplitBackend(ring(), std::move(mpi), kMeasuredAutoTable);
      return Status::OK();
    }
  }
#else
  if (want == CpuOperations::kMpi) {
    return Status::NotSupported(
        "HVDLITE_CPU_OPERATIONS=mpi is not available in this build; available: auto, ring (rebuild with Open "
        "MPI installed for mpi)");
  }
#endif
  *out = ring();  // auto
  return Status::OK();
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
