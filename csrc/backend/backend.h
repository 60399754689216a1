// Backend: runs one collective on raw host buffers among the members of a
// process set. Implementations: ring (algorithms over the native Transport,
// the CPU default) and mpi (MPI collectives, in builds with MPI). A backend
// that lacks an operation returns NotSupported. Called only from the
// runtime's background thread (construction and destruction excepted).
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/group.h"
#include "algorithms/reduce_kernels.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/status.h"

namespace hvdlite {

// How a reducing collective combines values, shared by the CPU backends'
// options and the GPU backend's GpuOp. Every implementation multiplies the
// input by `prescale` before reducing and the result by `postscale` after
// (ScaleBuffer's rules; 1.0 = no pass).
struct Reduction {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // Sum, Min, Max or Product (Average arrives as Sum + postscale)
  double prescale = 1.0;
  double postscale = 1.0;
};

// One options struct per collective: what it does (who takes part is the
// CollectiveContext). Buffers belong to the caller and stay valid for the call.
struct AllreduceOptions : Reduction {
  void* buf = nullptr;  // `count` elements of `dtype`, reduced in place
  int64_t count = 0;
};

struct AllgathervOptions {
  const void* send = nullptr;  // this member's bytes[me] bytes; may alias its slot in recv
  void* recv = nullptr;        // sum(bytes) bytes, member i's block at sum(bytes[0..i))
  std::vector<int64_t> bytes;  // per member
};

struct BroadcastOptions {
  void* buf = nullptr;  // `bytes` bytes: input on the root member, output on the others
  int64_t bytes = 0;
  int root_member = 0;  // index into CollectiveContext::ranks
};

struct AlltoallvOptions {
  const void* send = nullptr;       // send_bytes[j] bytes for member j, in member order
  std::vector<int64_t> send_bytes;  // per member
  void* recv = nullptr;             // recv_bytes[j] bytes from member j, in member order
  std::vector<int64_t> recv_bytes;  // per member
};

struct ReduceScatterOptions : Reduction {
  const void* in = nullptr;     // sum(counts) elements, member-ordered blocks; only read
  std::vector<int64_t> counts;  // elements per member
  void* out = nullptr;          // counts[me] elements, not overlapping `in`
};

// The collectives a Backend runs (the timeline names them with Describe).
enum class Collective { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // "backend/algorithm" for a collective of `bytes` over `members` (timeline).
  virtual std::string Describe(Collective c, int64_t bytes, int members) const = 0;
  virtual Status Allreduce(const CollectiveContext& ctx, const AllreduceOptions& o) = 0;
  virtual Status Allgatherv(const CollectiveContext& ctx, const AllgathervOptions& o) = 0;
  virtual Status Broadcast(const CollectiveContext& ctx, const BroadcastOptions& o) = 0;
  virtual Status Alltoallv(const CollectiveContext& ctx, const AlltoallvOptions& o) = 0;
  virtual Status ReduceScatter(const CollectiveContext& ctx, const ReduceScatterOptions& o) = 0;

  // True when Allreduce of `bytes` over `members` runs the flat recursive
  // doubling of algorithms.h here: then the steady state may reduce the
  // inputs its votes carried itself, with ReduceAsRecursiveDoubling, and get
  // the bits this backend would (coordinator/steady_state.h).
  virtual bool AllreduceIsRecursiveDoubling(int64_t bytes, int members) const { return false; }

  // Process-set life cycle. Called on every rank of the job (members or not)
  // in the one negotiated order, before any collective of the new set runs
  // and after the last one of a removed set. A backend that keeps a
  // communicator per set creates / frees it here.
  virtual Status AddProcessSet(int32_t id, const std::vector<int>& ranks) { return Status::OK(); }
  virtual void RemoveProcessSet(int32_t id) {}
};

// For backends that reduce an input they must not modify: `o.in` itself when
// o.prescale is 1, else a copy multiplied by it, kept in *scratch. (Inline: the
// optional backends use it without linking the registry's library.)
inline Status PrescaledInput(const ReduceScatterOptions& o, std::vector<char>* scratch, const void** out) {
  *out = o.in;
  if (o.prescale == 1.0) return Status::OK();
  int64_t total = 0;
  for (int64_t c : o.counts) total += c;
  const size_t bytes = static_cast<size_t>(total) * DataTypeSize(o.dtype);
  if (scratch->size() < bytes) scratch->resize(bytes);
  if (bytes) std::memcpy(scratch->data(), o.in, bytes);
  *out = scratch->data();
  return ScaleBuffer(scratch->data(), total, o.dtype, o.prescale);
}

// HVDLITE_CPU_OPERATIONS, parsed once: which CPU backend a job runs.
enum class CpuOperations { kAuto, kRing, kMpi };
// "auto" or "" -> kAuto, "ring" or "gloo" (Horovod's name for its own) -> kRing, "mpi" -> kMpi;
// InvalidArgument naming the accepted values otherwise.
Status ParseCpuOperations(const std::string& text, CpuOperations* out);

// Picks the CPU backend named by HVDLITE_CPU_OPERATIONS. NotSupported for a
// backend this build lacks, naming the ones it has.
// host_of[r] is global rank r's host index (Topology::host_of): the ring
// backend runs allreduce and allgather in two levels across hosts
// (HVDLITE_HIERARCHICAL_ALLREDUCE, HVDLITE_HIERARCHICAL_ALLGATHER).
Status CreateCpuBackend(const Config& cfg, Transport* transport, const std::vector<int>& host_of,
                        std::unique_ptr<Backend>* out);

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
