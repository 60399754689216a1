// HandleTable: the completion state of every submitted operation.
//
// The caller's thread creates a handle at submission and later polls or waits
// on it; the background thread completes it exactly once. Outputs the core
// allocates (allgather, alltoall, reducescatter) are owned by the handle until
// the caller takes them (and must then free them with FreeOutput) or releases
// the handle. Thread-safety: every method locks, except completions().
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/node_pool.h"
#include "common/status.h"

namespace hvdlite {

struct HandleResult {
  Status status;
  void* output = nullptr;  // 64-byte aligned, from AllocateOutput
  int64_t output_bytes = 0;
  std::vector<int64_t> output_shape;
  std::vector<int64_t> received_splits;  // alltoall: rows received from each member
  int32_t value = -1;                    // add_process_set: the new set's id
};

// Output buffers the core hands to callers (output_pool.cc): 64-byte aligned,
// never null for bytes == 0 (null only when out of memory); FreeOutput takes
// null and may be called from any thread. Large ones are recycled.
void* AllocateOutput(int64_t bytes);
void FreeOutput(void* p);

class HandleTable {
 public:
  int64_t Create();
  void Complete(int64_t handle, HandleResult result);
  // Fails every pending handle with `st` (the runtime broke or shut down).
  void FailAll(const Status& st);
  // 1 = done, 0 = pending, -1 = unknown handle.
  int Poll(int64_t handle) const;
  // Waits up to timeout_s; Timeout when still pending, InvalidArgument when
  // unknown; otherwise the operation's status.
  Status Wait(int64_t handle, double timeout_s) const;
  // Done (true, with the operation's status) or pending or unknown (false;
  // *known tells which).
  bool Done(int64_t handle, Status* status, bool* known) const;
  // Count of completions so far (Complete and FailAll calls): a lock-free
  // value a spinning waiter polls before it looks at its handle again.
  uint64_t completions() const { return completions_.load(std::memory_order_acquire); }
  // Moves the result out and forgets the handle; false when unknown or pending.
  bool Take(int64_t handle, HandleResult* out);
  // Forgets the handle, freeing an output nobody took.
  void Release(int64_t handle);

 private:
  struct State {
    bool done = false;
    HandleResult result;
  };
  std::atomic<uint64_t> completions_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::unordered_map<int64_t, State> states_;
  NodePool<std::unordered_map<int64_t, State>> pool_;  // states_'s nodes, recycled (one per operation)
  int64_t next_ = 1;
};

}  // namespace hvdlite
