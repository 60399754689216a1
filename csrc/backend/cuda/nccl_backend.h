// The GpuBackend of the NCCL module (see backend/gpu_backend.h for the
// contract). One CUDA device per process; one NCCL communicator per process
// set, created the first time a set runs a CUDA collective (every member
// reaches that point in the same negotiated order), through the job's store
// and bounded by HVDLITE_START_TIMEOUT (nccl_comm.h: a rank that never arrives
// is named in a Timeout, never a hang).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <map>

#include "backend/gpu_backend.h"

namespace hvdlite {
namespace cuda {

class NcclBackend : public GpuBackend {
 public:
  explicit NcclBackend(const GpuHost* host) : host_(host) {}
  ~NcclBackend() override;
  Status Allreduce(const CollectiveContext& ctx, const GpuOp& op) override;
  Status Broadcast(const CollectiveContext& ctx, const GpuOp& op) override;
  void RemoveProcessSet(int32_t id) override;
  Status StartP2p(const GpuP2p& op, int64_t* ticket) override;
  Status PollP2p(int64_t ticket, bool* done) override;

 private:
  struct PairChannel {  // point-to-point between this process and one peer (or itself)
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    Status failed;  // its set-up failed: every transfer of the pair fails so
  };
  struct Transfer {
    ncclComm_t comm = nullptr;
    cudaEvent_t done = nullptr;  // null: nothing was queued (0 bytes)
  };
  Status Channel(const GpuP2p& op, PairChannel** out);
  Status Prepare(int device);
  Status Comm(const CollectiveContext& ctx, ncclComm_t* out);
  Status WaitForInputs(const GpuOp& op);
  Status Finish(const GpuOp& op);
  Status FusionBuffer(size_t bytes, void** out);
  Status FusedAllreduce(const GpuOp& op, ncclComm_t comm, ncclDataType_t type, ncclRedOp_t rop);

  const GpuHost* host_;  // owned by the core; outlives this backend
  int device_ = -1;
  cudaStream_t stream_ = nullptr;  // all of the module's work, non-blocking
  cudaEvent_t ready_ = nullptr;    // recorded on a framework stream: inputs ready
  cudaEvent_t done_ = nullptr;     // recorded on stream_: results ready
  void* fusion_ = nullptr;
  size_t fusion_bytes_ = 0;
  std::map<int32_t, ncclComm_t> comms_;
  std::map<int32_t, uint64_t> generation_;  // communicators created so far, per process set id
  std::map<int, PairChannel> pairs_;        // by peer's global rank (this rank: to self)
  std::map<int64_t, Transfer> transfers_;   // queued point-to-point transfers, by ticket
  int64_t next_ticket_ = 1;
};

}  // namespace cuda
}  // namespace hvdlite
