// Backend: runs one collective on raw host buffers among the members of a
// process set. Implementations: ring (algorithms over the native Transport,
// the CPU default) and mpi (MPI collectives, in builds with MPI). A backend
// that lacks an operation returns NotSupported. Called only from the
// runtime's background thread (construction and destruction excepted).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/reduce_kernels.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/status.h"

namespace hvdlite {

class Transport;

// Who takes part in one collective.
struct CollectiveContext {
  int32_t process_set = 0;
  std::vector<int> ranks;  // global ranks, ascending
  int me = 0;              // this process's index in `ranks`
  uint32_t tag = 0;        // unique per collective (wraps); step numbers are added below it
};

enum class Collective { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // "backend/algorithm" for a collective of `bytes` over `members` (timeline).
  virtual std::string Describe(Collective c, int64_t bytes, int members) const = 0;
  virtual Status Allreduce(const CollectiveContext& ctx, void* buf, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  // Allreduce, then the result times `postscale` (ScaleBuffer's rules). The
  // default makes a separate pass; a backend can scale while data is in cache.
  // Inline (as every non-pure virtual here), so that the optional mpi backend
  // (a layer below backend/, which creates it in registry.cc) links without it.
  virtual Status AllreduceAndScale(const CollectiveContext& ctx, void* buf, int64_t count, DataType dtype,
                                   ReduceOp op, double postscale) {
    HVD_RETURN_IF_ERROR(Allreduce(ctx, buf, count, dtype, op));
    return ScaleBuffer(buf, count, dtype, postscale);
  }
  virtual Status Allgatherv(const CollectiveContext& ctx, const void* send, void* recv,
                            const std::vector<int64_t>& bytes) = 0;
  virtual Status Broadcast(const CollectiveContext& ctx, void* buf, int64_t len, int root_member) = 0;
  virtual Status Alltoallv(const CollectiveContext& ctx, const void* send,
                           const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>& recv_bytes) = 0;
  // `buf` is the caller's input: implementations must not modify it.
  virtual Status ReduceScatter(const CollectiveContext& ctx, void* buf, const std::vector<int64_t>& counts,
                               void* out, DataType dtype, ReduceOp op) = 0;

  // Process-set life cycle. Called on every rank of the job (members or not)
  // in the one negotiated order, before any collective of the new set runs
  // and after the last one of a removed set. A backend that keeps a
  // communicator per set creates / frees it here.
  virtual Status AddProcessSet(int32_t id, const std::vector<int>& ranks) { return Status::OK(); }
  virtual void RemoveProcessSet(int32_t id) {}
};

// Picks the CPU backend named by HVDLITE_CPU_OPERATIONS. NotSupported for a
// backend this build lacks, naming the ones it has.
Status CreateCpuBackend(const Config& cfg, Transport* transport, std::unique_ptr<Backend>* out);

// Backends compiled into this build, e.g. {"ring", "mpi"}.
std::vector<const char*> BuiltBackends();

// ---- Job formation under an MPI launcher (mpirun, mpiexec) ----

// What MpiRendezvous hands the bootstrap: this process's place in
// MPI_COMM_WORLD and a rendezvous store to form the hvdlite job through.
struct MpiJob {
  int rank = 0, size = 1;
  std::string store_addr;  // "host:port"; empty when size == 1
  std::string secret;      // raw bytes, fresh per call
  // Rank 0 only: the store server; the store stops when the last copy goes.
  std::shared_ptr<void> store_server;
};

// True when this build has the mpi backend.
bool MpiBuilt();
// Initializes MPI unless someone (mpi4py, the user) already has, takes rank
// and size from MPI_COMM_WORLD, and has rank 0 start a TCP store (loopback
// when every rank is on this host) whose address and a random secret it
// broadcasts over MPI. Collective over MPI_COMM_WORLD: every process calls
// it, once per init(); Timeout when some rank has not called it within
// timeout_s. NotSupported in a build without MPI.
Status MpiRendezvous(double timeout_s, MpiJob* out);
// MPI's thread support level (MPI_THREAD_*) once initialized; -1 before,
// or in a build without MPI.
int MpiThreadLevel();

}  // namespace hvdlite
