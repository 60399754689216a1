// GpuBackend: collectives on CUDA device buffers. Implemented by the NCCL
// module (csrc/backend/cuda/, built as the separate shared library
// libhvdlite_cuda.so where nvcc and NCCL are found) and loaded with dlopen the
// first time an operation names a device, so the core links no CUDA and
// CPU-only users pay nothing. This header is the whole contract between the
// two: it includes no CUDA header (streams are void*), and both sides are
// built together from one tree (kGpuAbiVersion guards against mixing).
//
// Threading: every call comes from the runtime's background thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace hvdlite {

class Store;

// 2: GpuHost is the job's store; 3: GpuOp is a Reduction and carries root_member;
// 4: point-to-point (StartP2p / PollP2p).
constexpr int kGpuAbiVersion = 4;

struct GpuTensor {
  void* data = nullptr;    // device memory on GpuOp::device
  int64_t count = 0;       // elements
  void* stream = nullptr;  // the framework's cudaStream_t the data is ready on (null = legacy default)
};

// One GPU collective: the Reduction (dtype, op and scales, as for the CPU
// backends; broadcast uses only dtype) and the tensors.
struct GpuOp : Reduction {
  int device = 0;       // CUDA device ordinal of every tensor
  int root_member = 0;  // broadcast: index into CollectiveContext::ranks
  std::vector<GpuTensor> tensors;
};

// One side of a matched point-to-point transfer of `bytes` bytes between this
// process (global rank `me`) and global rank `peer` (runtime/p2p.h matched
// it): send_data is sent, recv_data received into (either may be null, not
// both). peer == me: both are set, and the module runs them as one grouped
// ncclSend + ncclRecv to self (NCCL requires a send to self and its receive in
// one group). The data must be ready on the device (the caller synchronized
// the framework's stream before posting).
struct GpuP2p {
  int device = 0;
  int me = -1;
  int peer = -1;
  const void* send_data = nullptr;
  void* recv_data = nullptr;
  size_t bytes = 0;
};

// What the core gives the module: the job's rendezvous store, through which
// NCCL unique ids travel and ranks announce that they reached a communicator's
// set-up (so a timeout names the ranks that never came), and the bound of that
// set-up. Owned by the runtime; valid until the module's backend is destroyed.
// The module calls the store only through Store's virtual functions.
struct GpuHost {
  Store* store = nullptr;         // thread-safe (Store's contract)
  std::string key_prefix;         // unique per job and per init()
  double setup_timeout_s = 30.0;  // HVDLITE_START_TIMEOUT
};

// Every call returns once the result is complete on the device: the module
// makes its own stream wait on events recorded on the tensors' streams (no
// device-wide synchronisation), works on its stream, records a completion
// event, makes the tensors' streams wait on it and waits for it on the host.
class GpuBackend {
 public:
  virtual ~GpuBackend() = default;
  // In place on every tensor; several tensors are fused through a device
  // buffer by batched pack/unpack kernels that also apply the scales.
  virtual Status Allreduce(const CollectiveContext& ctx, const GpuOp& op) = 0;
  // tensors[0] from member op.root_member to every member, in place.
  virtual Status Broadcast(const CollectiveContext& ctx, const GpuOp& op) = 0;
  // Frees the set's communicator, if one was created. Called on every member.
  virtual void RemoveProcessSet(int32_t id) = 0;
  // Point-to-point, unlike the collectives, returns once the transfer is
  // queued on the device: *ticket is for PollP2p. The pair (me, peer) has one
  // communicator and one stream of its own, made by the first transfer
  // between them on both sides (blocking, bounded by setup_timeout_s; a
  // failure is kept and returned for every later transfer of the pair). Both
  // sides must start the pair's transfers in the same order (the caller's
  // contract: runtime/p2p_device.cc orders them by the pair's lower rank).
  virtual Status StartP2p(const GpuP2p& op, int64_t* ticket) = 0;
  // Never blocks: *done once the transfer has finished on the device (the
  // ticket is then forgotten); an error when it failed (NCCL's async error).
  virtual Status PollP2p(int64_t ticket, bool* done) = 0;
};

// Exported by the module (extern "C"): creates its backend, or writes an
// error and returns non-zero (a StatusCode).
using GpuBackendFactory = int (*)(int abi_version, GpuHost* host, GpuBackend** out, char* err,
                                  size_t err_len);
constexpr const char* kGpuFactorySymbol = "hvdlite_gpu_backend_create";
constexpr const char* kGpuModuleFile = "libhvdlite_cuda.so";

// Core side (gpu_module.cc): dlopens kGpuModuleFile from the directory of the
// core's own shared object and creates the backend. NotSupported, saying why
// and what to do, when the module is absent or cannot load (no NCCL, no driver).
Status LoadGpuBackend(GpuHost* host, std::unique_ptr<GpuBackend>* out);
// True when the module file is installed beside the core (nothing is loaded).
bool GpuModuleInstalled();

}  // namespace hvdlite
