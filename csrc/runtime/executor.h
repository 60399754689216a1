// Executor: runs the responses the coordinator decided, in order, on this
// rank's entries: packs fused tensors into the fusion buffer, applies
// prescale/postscale, allocates outputs the core owns, calls the Backend, and
// completes the handles.
// Threading: background thread only.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/gpu_backend.h"
#include "coordinator/messages.h"
#include "coordinator/process_sets.h"
#include "coordinator/response_cache.h"
#include "coordinator/timeline.h"
#include "runtime/handles.h"
#include "runtime/tensor_queue.h"

namespace hvdlite {

class Executor {
 public:
  // `timeline` may be null (ranks other than 0 write none).
  Executor(int rank, Backend* backend, ProcessSetTable* sets, HandleTable* handles, TensorQueue* queue,
           LocalRequestCache* cache, Timeline* timeline);
  // Runs one response. A non-OK return means the data plane failed (a peer
  // died or hung): the runtime must stop. Validation errors from the
  // coordinator only fail the named entries and return OK.
  Status Execute(const Response& response) { return Execute(response, /*remember=*/true); }
  // Execute, for a response of the steady-state schedule (run without the
  // coordinator): counted in Stats::scheduled_responses. Its cache ids are not
  // remembered again: this rank's requests matched them already, and one the
  // coordinator evicted since must stay forgotten (ids are never reused).
  // `voted_inputs` (null: none) are every member's input to an allreduce
  // group, as the ready votes carried them (VotedInput, in member order): the
  // group reduces them here, along recursive doubling's tree, instead of
  // running the backend's collective (coordinator/steady_state.h).
  Status ExecuteScheduled(const Response& response, const std::vector<const char*>* voted_inputs = nullptr);
  // Serializes into *vote (SerializeWithRoom) the input this rank's ready vote
  // for the schedule's `response` carries: its tensors packed in the
  // response's order and prescaled, as the backend would get them. False (and
  // *vote untouched) unless the response is one CPU allreduce the backend
  // runs by recursive doubling, with at most kVotedInputMaxBytes to all peers.
  // Engine only, while the response's tensors are pending here.
  bool VotedInput(const Response& response, Vote* vote);
  // Peers get a voted input each: above this many bytes to all of them
  // together, the collective costs less. Measured with 2 ranks (NumPy
  // allreduce_ against the collective): over shared memory, whose control
  // ring moves 8 KiB pieces, 8 KiB 4.5 -> 3.9 us, 16 KiB 5.3 -> 5.2, but
  // 32 KiB 6.7 -> 7.9 and 60 KiB 8.7 -> 11.3; over TCP every size up to
  // 60 KiB gains (16 KiB 27 -> 15 us). One limit for both: the smaller.
  static constexpr int64_t kVotedInputMaxBytes = 16 << 10;
  // Hands over the loaded NCCL module (any thread; once). Until then, CUDA
  // operations fail.
  void SetGpuBackend(GpuBackend* gpu) { gpu_.store(gpu); }
  // Allreduce bytes and responses executed so far (the autotuner's measure).
  int64_t allreduce_bytes() const { return allreduce_bytes_; }
  int allreduce_responses() const { return allreduce_responses_; }
  // Counters any thread may read (hvdlite_get_stats): allreduce responses
  // executed (CPU and CUDA), the tensors they carried, and how many of them
  // carried more than one tensor (fused); responses of any kind run from the
  // steady-state schedule, without the coordinator, and how many of those
  // were allreduces reduced from the inputs their votes carried.
  struct Stats {
    std::atomic<int64_t> allreduce_responses{0}, allreduce_tensors{0}, fused_responses{0};
    std::atomic<int64_t> scheduled_responses{0}, voted_responses{0};
    std::atomic<int64_t> alltoall_bytes_sent{0};  // to other members (a rank's own part stays)
  };
  const Stats& stats() const { return stats_; }

 private:
  Status Execute(const Response& response, bool remember);
  Status Run(const Response& r, std::vector<TensorEntry>& entries, HandleResult* result);
  Status RunAllreduce(const CollectiveContext& ctx, std::vector<TensorEntry>& entries);
  Status ReduceVotedInputs(const CollectiveContext& ctx, std::vector<TensorEntry>& entries);
  Status ReduceInPlace(const CollectiveContext& ctx, const Request& q, void* data, int64_t count);
  Status PlaceOutput(const TensorEntry& e, int64_t bytes, HandleResult* out, void** where);
  Status RunAllgather(const CollectiveContext& ctx, const Response& r, TensorEntry& e, HandleResult* out);
  Status RunAlltoall(const CollectiveContext& ctx, const Response& r, TensorEntry& e, HandleResult* out);
  Status RunReducescatter(const CollectiveContext& ctx, TensorEntry& e, HandleResult* out);
  Status RunProcessSetOp(const Response& r, TensorEntry& e, HandleResult* out);
  Status RunGpu(const CollectiveContext& ctx, const Response& r, std::vector<TensorEntry>& entries);
  CollectiveContext Context(int32_t process_set);
  void* Scratch(int64_t bytes);
  TensorEntry StandIn(const Request& spec);
  void TraceBegin(const std::vector<TensorEntry>& entries, const std::string& phase);
  void TraceEnd(const std::vector<TensorEntry>& entries, const std::string& phase,
                const std::string& args = "");
  std::string Describe(const Response& r, const std::vector<TensorEntry>& entries);
  int rank_;
  Backend* backend_;
  ProcessSetTable* sets_;
  HandleTable* handles_;
  TensorQueue* queue_;
  LocalRequestCache* cache_;
  Timeline* timeline_;
  std::map<int32_t, uint32_t> sequence_;  // per process set, for message tags
  std::vector<char> fusion_buffer_;
  std::atomic<GpuBackend*> gpu_{nullptr};
  int64_t allreduce_bytes_ = 0;
  int allreduce_responses_ = 0;
  Stats stats_;
  std::vector<std::vector<char>> stand_in_buffers_;         // live during one Execute()
  std::vector<TensorEntry> entries_;                        // Execute()'s, reused (capacity only)
  std::vector<const TensorEntry*> voted_entries_;           // VotedInput()'s, reused
  const std::vector<const char*>* voted_inputs_ = nullptr;  // set during one ExecuteScheduled()
};

}  // namespace hvdlite
