// Point-to-point of the NCCL module (backend/gpu_backend.h: StartP2p, PollP2p).
//
// Each pair of ranks that exchanges CUDA tensors gets a two-member
// communicator of its own (a rank sending to itself, a one-member one) and a
// stream of its own, so a transfer between two ranks never waits behind a
// collective or another pair's transfer. Within a pair, both directions share
// the communicator: the core starts the pair's transfers in one order on both
// sides (runtime/p2p_device.cc), which is what NCCL requires of the
// operations on one communicator. Transfers are queued and polled (an event
// per transfer), never waited for here.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <string>

#include "backend/cuda/nccl_backend.h"
#include "backend/cuda/nccl_comm.h"

namespace hvdlite {
namespace cuda {

#define HVD_P2P_CUDA(call)                                                                \
  do {                                                                                    \
    cudaError_t _e = (call);                                                              \
    if (_e != cudaSuccess)                                                                \
      return Status::Internal(std::string(#call) + " failed: " + cudaGetErrorString(_e)); \
  } while (0)

// The pair's communicator and stream, made on first use. Both members reach
// this point for their first transfer (the lower rank as it starts it, the
// higher one when told to: p2p_device.cc), so the set-up meets; it blocks for
// at most setup_timeout_s.
Status NcclBackend::Channel(const GpuP2p& op, PairChannel** out) {
  auto it = pairs_.find(op.peer);
  if (it == pairs_.end()) {
    PairChannel ch;
    const int lo = std::min(op.me, op.peer), hi = std::max(op.me, op.peer);
    CommSetup setup;
    setup.store = host_->store;
    setup.key = host_->key_prefix + "p2p/" + std::to_string(lo) + "-" + std::to_string(hi);
    setup.ranks = lo == hi ? std::vector<int>{lo} : std::vector<int>{lo, hi};
    setup.me = op.me == lo ? 0 : 1;
    setup.timeout_s = host_->setup_timeout_s;
    setup.what =
        lo == hi ? "rank " + std::to_string(lo) + "'s point-to-point to itself"
                 : "the point-to-point pair of ranks " + std::to_string(lo) + " and " + std::to_string(hi);
    ch.failed = InitNcclComm(setup, &ch.comm);
    if (ch.failed.ok()) {
      cudaError_t e = cudaStreamCreateWithFlags(&ch.stream, cudaStreamNonBlocking);
      if (e != cudaSuccess)
        ch.failed = Status::Internal(std::string("cudaStreamCreate: ") + cudaGetErrorString(e));
    }
    it = pairs_.emplace(op.peer, std::move(ch)).first;
  }
  *out = &it->second;
  return it->second.failed;
}

Status NcclBackend::StartP2p(const GpuP2p& op, int64_t* ticket) {
  HVD_RETURN_IF_ERROR(Prepare(op.device));
  PairChannel* ch = nullptr;
  HVD_RETURN_IF_ERROR(Channel(op, &ch));
  Transfer t;
  t.comm = ch->comm;
  if (op.bytes > 0) {
    const int peer = op.me == op.peer ? 0 : (op.me < op.peer ? 1 : 0);  // the peer's index in the pair
    const Deadline deadline = Deadline::After(host_->setup_timeout_s);
    HVD_RETURN_IF_ERROR(SettleNccl(ch->comm, ncclGroupStart(), "ncclGroupStart", deadline));
    ncclResult_t r = ncclSuccess;
    if (op.send_data) r = ncclSend(op.send_data, op.bytes, ncclUint8, peer, ch->comm, ch->stream);
    if (r == ncclSuccess && op.recv_data)
      r = ncclRecv(op.recv_data, op.bytes, ncclUint8, peer, ch->comm, ch->stream);
    ncclResult_t end = ncclGroupEnd();  // always closes the group, even after an error inside it
    HVD_RETURN_IF_ERROR(SettleNccl(ch->comm, r, op.send_data ? "ncclSend" : "ncclRecv", deadline));
    HVD_RETURN_IF_ERROR(SettleNccl(ch->comm, end, "ncclGroupEnd", deadline));
    HVD_P2P_CUDA(cudaEventCreateWithFlags(&t.done, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(t.done, ch->stream);
    if (e != cudaSuccess) {
      cudaEventDestroy(t.done);
      return Status::Internal(std::string("cudaEventRecord failed: ") + cudaGetErrorString(e));
    }
  }
  *ticket = next_ticket_++;
  transfers_[*ticket] = t;
  return Status::OK();
}

Status NcclBackend::PollP2p(int64_t ticket, bool* done) {
  *done = false;
  auto it = transfers_.find(ticket);
  if (it == transfers_.end()) return Status::Internal("unknown point-to-point ticket");
  Transfer t = it->second;
  Status st;
  if (t.done != nullptr) {
    cudaError_t e = cudaEventQuery(t.done);
    if (e == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(t.comm, &async);
      if (async == ncclSuccess || async == ncclInProgress) return Status::OK();
      st = Status::Internal(std::string("NCCL point-to-point failed: ") + ncclGetErrorString(async));
    } else if (e != cudaSuccess) {
      st =
          Status::Internal(std::string("NCCL point-to-point failed on the device: ") + cudaGetErrorString(e));
    }
    cudaEventDestroy(t.done);
  }
  transfers_.erase(it);
  *done = true;
  return st;
}

}  // namespace cuda
}  // namespace hvdlite
