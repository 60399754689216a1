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

 private:
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
};

}  // namespace cuda
}  // namespace hvdlite
