// Backend: runs one collective on raw host buffers among the members of a
// process set. Implementations: ring (algorithms over the native Transport,
// the CPU default). Later: mpi, nccl. A backend that lacks an operation
// returns NotSupported. Called only from the runtime's background thread.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

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

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Status Allreduce(const CollectiveContext& ctx, void* buf, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  // Allreduce, then the result times `postscale` (ScaleBuffer's rules). The
  // default makes a separate pass; a backend can scale while data is in cache.
  virtual Status AllreduceAndScale(const CollectiveContext& ctx, void* buf, int64_t count, DataType dtype,
                                   ReduceOp op, double postscale);
  virtual Status Allgatherv(const CollectiveContext& ctx, const void* send, void* recv,
                            const std::vector<int64_t>& bytes) = 0;
  virtual Status Broadcast(const CollectiveContext& ctx, void* buf, int64_t len, int root_member) = 0;
  virtual Status Alltoallv(const CollectiveContext& ctx, const void* send, const std::vector<int64_t>& send_bytes,
                           void* recv, const std::vector<int64_t>& recv_bytes) = 0;
  // `buf` is the caller's input: implementations must not modify it.
  virtual Status ReduceScatter(const CollectiveContext& ctx, void* buf, const std::vector<int64_t>& counts,
                               void* out, DataType dtype, ReduceOp op) = 0;
};

// Picks the CPU backend named by HVDLITE_CPU_OPERATIONS. NotSupported for a
// backend this build lacks, naming the ones it has.
Status CreateCpuBackend(const Config& cfg, Transport* transport, std::unique_ptr<Backend>* out);

// Backends compiled into this build, e.g. {"ring"}.
std::vector<const char*> BuiltBackends();

}  // namespace hvdlite
