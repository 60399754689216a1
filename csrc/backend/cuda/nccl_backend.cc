#include "backend/cuda/nccl_backend.h"

#include <set>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/nccl_comm.h"

namespace hvdlite {
namespace cuda {
namespace {

#define HVD_CUDA_CALL(call)                                                               \
  do {                                                                                    \
    cudaError_t _e = (call);                                                              \
    if (_e != cudaSuccess)                                                                \
      return Status::Internal(std::string(#call) + " failed: " + cudaGetErrorString(_e)); \
  } while (0)

// A call on a communicator, which is non-blocking (nccl_comm.h): it may
// return ncclInProgress, and is settled (bounded by the set-up timeout) before
// anything is queued after it.
#define HVD_NCCL_CALL(comm, call) \
  HVD_RETURN_IF_ERROR(SettleNccl((comm), (call), #call, Deadline::After(host_->setup_timeout_s)))

Status NcclType(DataType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DataType::kUInt8:
      *out = ncclUint8;
      return Status::OK();
    case DataType::kInt8:
      *out = ncclInt8;
      return Status::OK();
    case DataType::kInt32:
      *out = ncclInt32;
      return Status::OK();
    case DataType::kInt64:
      *out = ncclInt64;
      return Status::OK();
    case DataType::kFloat16:
      *out = ncclFloat16;
      return Status::OK();
    case DataType::kBFloat16:
      *out = ncclBfloat16;
      return Status::OK();
    case DataType::kFloat32:
      *out = ncclFloat32;
      return Status::OK();
    case DataType::kFloat64:
      *out = ncclFloat64;
      return Status::OK();
    default:
      return Status::NotSupported(std::string("NCCL cannot reduce ") + DataTypeName(dtype));
  }
}

Status NcclOp(ReduceOp op, ncclRedOp_t* out) {
  switch (op) {
    case ReduceOp::kSum:
      *out = ncclSum;
      return Status::OK();
    case ReduceOp::kMin:
      *out = ncclMin;
      return Status::OK();
    case ReduceOp::kMax:
      *out = ncclMax;
      return Status::OK();
    case ReduceOp::kProduct:
      *out = ncclProd;
      return Status::OK();
    default:
      return Status::NotSupported(std::string("NCCL reduction ") + ReduceOpName(op));
  }
}

std::set<cudaStream_t> Streams(const GpuOp& op) {
  std::set<cudaStream_t> out;
  for (const auto& t : op.tensors) out.insert(static_cast<cudaStream_t>(t.stream));
  return out;
}

}  // namespace

NcclBackend::~NcclBackend() {
  for (auto& kv : comms_) ncclCommDestroy(kv.second);
  if (device_ < 0) return;
  cudaSetDevice(device_);
  for (auto& kv : pairs_) {  // point-to-point (nccl_p2p.cc): transfers end, then their events go
    if (kv.second.stream) cudaStreamSynchronize(kv.second.stream);
  }
  for (auto& kv : transfers_) {
    if (kv.second.done) cudaEventDestroy(kv.second.done);
  }
  for (auto& kv : pairs_) {
    if (kv.second.comm) ncclCommDestroy(kv.second.comm);
    if (kv.second.stream) cudaStreamDestroy(kv.second.stream);
  }
  if (stream_) cudaStreamSynchronize(stream_);
  if (fusion_) cudaFree(fusion_);
  if (ready_) cudaEventDestroy(ready_);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
}

// First use: bind this thread to the device and create the stream and events.
Status NcclBackend::Prepare(int device) {
  if (device_ >= 0 && device != device_) {
    return Status::NotSupported("CUDA tensors on device " + std::to_string(device) + " after device " +
                                std::to_string(device_) +
                                ": hvdlite uses one GPU per process (pick it with "
                                "torch.cuda.set_device(hvd.local_rank()))");
  }
  HVD_CUDA_CALL(cudaSetDevice(device));
  if (device_ >= 0) return Status::OK();
  HVD_CUDA_CALL(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  HVD_CUDA_CALL(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  HVD_CUDA_CALL(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  device_ = device;
  return Status::OK();
}

Status NcclBackend::Comm(const CollectiveContext& ctx, ncclComm_t* out) {
  auto it = comms_.find(ctx.process_set);
  if (it != comms_.end()) {
    *out = it->second;
    return Status::OK();
  }
  // Every member creates the set's n-th communicator in the same negotiated
  // order, so (set id, n) names it alike on every member.
  CommSetup setup;
  setup.store = host_->store;
  setup.key = host_->key_prefix + std::to_string(ctx.process_set) + "/" +
              std::to_string(generation_[ctx.process_set]++);
  setup.ranks = ctx.ranks;
  setup.me = ctx.me;
  setup.timeout_s = host_->setup_timeout_s;
  setup.what = "process set " + std::to_string(ctx.process_set);
  ncclComm_t comm = nullptr;
  HVD_RETURN_IF_ERROR(InitNcclComm(setup, &comm));
  comms_[ctx.process_set] = comm;
  *out = comm;
  return Status::OK();
}

Status NcclBackend::WaitForInputs(const GpuOp& op) {
  for (cudaStream_t s : Streams(op)) {
    HVD_CUDA_CALL(cudaEventRecord(ready_, s));
    HVD_CUDA_CALL(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  return Status::OK();
}

// Results are ready on stream_: order the framework's streams after them and
// wait for that one event on the host.
Status NcclBackend::Finish(const GpuOp& op) {
  HVD_CUDA_CALL(cudaEventRecord(done_, stream_));
  for (cudaStream_t s : Streams(op)) HVD_CUDA_CALL(cudaStreamWaitEvent(s, done_, 0));
  HVD_CUDA_CALL(cudaEventSynchronize(done_));
  return Status::OK();
}

// Grows with the stream-ordered allocator, so growing never syncs the device.
Status NcclBackend::FusionBuffer(size_t bytes, void** out) {
  if (bytes > fusion_bytes_) {
    if (fusion_) HVD_CUDA_CALL(cudaFreeAsync(fusion_, stream_));
    fusion_ = nullptr;
    fusion_bytes_ = 0;
    HVD_CUDA_CALL(cudaMallocAsync(&fusion_, bytes, stream_));
    fusion_bytes_ = bytes;
  }
  *out = fusion_;
  return Status::OK();
}

Status NcclBackend::Allreduce(const CollectiveContext& ctx, const GpuOp& op) {
  ncclDataType_t type;
  ncclRedOp_t rop;
  HVD_RETURN_IF_ERROR(NcclType(op.dtype, &type));
  HVD_RETURN_IF_ERROR(NcclOp(op.op, &rop));
  HVD_RETURN_IF_ERROR(Prepare(op.device));
  ncclComm_t comm;
  HVD_RETURN_IF_ERROR(Comm(ctx, &comm));
  HVD_RETURN_IF_ERROR(WaitForInputs(op));
  if (op.tensors.size() == 1) {
    const GpuTensor& t = op.tensors[0];
    if (t.count > 0) {
      HVD_CUDA_CALL(ScaleInPlace(t.data, t.count, op.dtype, op.prescale, stream_));
      HVD_NCCL_CALL(comm,
                    ncclAllReduce(t.data, t.data, static_cast<size_t>(t.count), type, rop, comm, stream_));
      HVD_CUDA_CALL(ScaleInPlace(t.data, t.count, op.dtype, op.postscale, stream_));
    }
  } else {
    HVD_RETURN_IF_ERROR(FusedAllreduce(op, comm, type, rop));
  }
  return Finish(op);
}

// Pack (with prescale) into the fusion buffer, reduce once, unpack (with postscale).
Status NcclBackend::FusedAllreduce(const GpuOp& op, ncclComm_t comm, ncclDataType_t type, ncclRedOp_t rop) {
  const size_t esize = ElementSize(op.dtype);
  int64_t total = 0;
  for (const auto& t : op.tensors) total += t.count;
  if (total == 0) return Status::OK();
  void* fused = nullptr;
  HVD_RETURN_IF_ERROR(FusionBuffer(static_cast<size_t>(total) * esize, &fused));
  std::vector<CopySpec> pack, unpack;
  char* at = static_cast<char*>(fused);
  for (const auto& t : op.tensors) {
    pack.push_back(CopySpec{t.data, at, t.count});
    unpack.push_back(CopySpec{at, t.data, t.count});
    at += static_cast<size_t>(t.count) * esize;
  }
  const int n = static_cast<int>(pack.size());
  HVD_CUDA_CALL(BatchedScaledCopy(pack.data(), n, op.dtype, op.prescale, stream_));
  HVD_NCCL_CALL(comm, ncclAllReduce(fused, fused, static_cast<size_t>(total), type, rop, comm, stream_));
  HVD_CUDA_CALL(BatchedScaledCopy(unpack.data(), n, op.dtype, op.postscale, stream_));
  return Status::OK();
}

Status NcclBackend::Broadcast(const CollectiveContext& ctx, const GpuOp& op) {
  HVD_RETURN_IF_ERROR(Prepare(op.device));
  ncclComm_t comm;
  HVD_RETURN_IF_ERROR(Comm(ctx, &comm));
  HVD_RETURN_IF_ERROR(WaitForInputs(op));
  const GpuTensor& t = op.tensors.at(0);
  const size_t bytes = static_cast<size_t>(t.count) * ElementSize(op.dtype);
  if (bytes > 0)
    HVD_NCCL_CALL(comm, ncclBroadcast(t.data, t.data, bytes, ncclUint8, op.root_member, comm, stream_));
  return Finish(op);
}

void NcclBackend::RemoveProcessSet(int32_t id) {
  auto it = comms_.find(id);
  if (it == comms_.end()) return;
  // The communicator is idle here (every call on it was settled), so destroy does not wait on peers.
  ncclCommDestroy(it->second);
  comms_.erase(it);
}

}  // namespace cuda
}  // namespace hvdlite
