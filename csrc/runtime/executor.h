// Executor: runs the responses the coordinator decided, in order, on this
// rank's entries: packs fused tensors into the fusion buffer, applies
// prescale/postscale, allocates outputs the core owns, calls the Backend, and
// completes the handles.
// Threading: background thread only.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "backend/backend.h"
#include "coordinator/messages.h"
#include "coordinator/process_sets.h"
#include "coordinator/response_cache.h"
#include "runtime/handles.h"
#include "runtime/tensor_queue.h"

namespace hvdlite {

class Executor {
 public:
  Executor(int rank, Backend* backend, ProcessSetTable* sets, HandleTable* handles, TensorQueue* queue,
           LocalRequestCache* cache);
  // Runs one response. A non-OK return means the data plane failed (a peer
  // died or hung): the runtime must stop. Validation errors from the
  // coordinator only fail the named entries and return OK.
  Status Execute(const Response& response);

 private:
  Status Run(const Response& r, std::vector<TensorEntry>& entries, HandleResult* result);
  Status RunAllreduce(const CollectiveContext& ctx, std::vector<TensorEntry>& entries);
  Status ReduceInPlace(const CollectiveContext& ctx, const Request& q, void* data, int64_t count);
  Status RunAllgather(const CollectiveContext& ctx, const Response& r, TensorEntry& e, HandleResult* out);
  Status RunAlltoall(const CollectiveContext& ctx, const Response& r, TensorEntry& e, HandleResult* out);
  Status RunReducescatter(const CollectiveContext& ctx, TensorEntry& e, HandleResult* out);
  Status RunProcessSetOp(const Response& r, TensorEntry& e, HandleResult* out);
  CollectiveContext Context(int32_t process_set);
  void* Scratch(int64_t bytes);

  int rank_;
  Backend* backend_;
  ProcessSetTable* sets_;
  HandleTable* handles_;
  TensorQueue* queue_;
  LocalRequestCache* cache_;
  std::map<int32_t, uint32_t> sequence_;  // per process set, for message tags
  std::vector<char> fusion_buffer_;
};

}  // namespace hvdlite
