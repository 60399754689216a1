// Runtime: the one object that owns a process's hvdlite state between init()
// and shutdown(): config, topology, transport, backend, coordinator (rank 0),
// tensor queue, handles, and the background thread that drives them.
//
// Threading: Enqueue/handles/queries may be called from any thread; the
// background thread alone touches the transport, coordinator and executor.
// Failure: when the data or control plane fails (a peer died or hung), the
// runtime is "broken": every pending and later operation fails with that
// first error, naming the rank; shutdown() still works.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/gpu_backend.h"
#include "common/config.h"
#include "coordinator/autotuner.h"
#include "coordinator/coordinator.h"
#include "coordinator/process_sets.h"
#include "coordinator/response_cache.h"
#include "runtime/bootstrap.h"
#include "runtime/executor.h"
#include "runtime/handles.h"
#include "runtime/tensor_queue.h"
#include "transport/transport.h"

namespace hvdlite {

class Runtime {
 public:
  // Reads the Config, bootstraps the job (blocking, bounded by
  // HVDLITE_START_TIMEOUT) and starts the background thread.
  static Status Create(std::unique_ptr<Runtime>* out);
  ~Runtime();

  const Topology& topology() const { return topo_; }
  const Config& config() const { return cfg_; }
  const char* cpu_backend_name() const { return backend_->name(); }
  ProcessSetTable& process_sets() { return sets_; }
  HandleTable& handles() { return handles_; }

  // Submits an operation; `data` must stay valid until the handle completes.
  // Fails at once (no handle) when the runtime is broken or shut down, or the
  // name is already in flight. CUDA data (request.device >= 0) is read once
  // the work queued so far on `stream` is done (null = the legacy default stream).
  Status Enqueue(const Request& request, void* data, int64_t* handle, void* stream = nullptr);
  // Blocks until every rank has called Shutdown (bounded by
  // HVDLITE_SHUTDOWN_TIMEOUT_SECONDS), then closes connections. Idempotent.
  Status Shutdown();
  // Starts/stops the Chrome-trace timeline; only rank 0 writes one (a no-op elsewhere).
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();

 private:
  Runtime() = default;
  void Loop();
  Status SendNewRequests();
  Status HandleIncoming(std::vector<ControlMessage>& incoming, std::vector<Response>* todo, bool* finished);
  Status Coordinate(std::vector<Response>* todo);
  int WaitBudgetMs(bool shutting_down);
  void Break(const Status& st);
  Status AdmitCudaTensor(const Request& request);
  void Leave();

  Config cfg_;
  Topology topo_;
  std::shared_ptr<void> bootstrap_keepalive_;  // e.g. the store rank 0 hosts under mpirun
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<Executor> executor_;
  std::mutex gpu_mu_;                  // guards loading the NCCL module
  std::unique_ptr<GpuBackend> gpu_;    // loaded on the first CUDA tensor; destroyed before executor_
  Status gpu_error_;                   // why loading failed, once it has
  std::unique_ptr<Autotuner> autotuner_;   // rank 0 only
  ProcessSetTable sets_;
  HandleTable handles_;
  TensorQueue queue_;
  LocalRequestCache local_cache_;
  Timeline timeline_;  // rank 0 only

  std::thread thread_;
  std::mutex state_mu_;
  Status broken_;              // first fatal error, or "shut down"
  bool stopped_ = false;       // no new work is accepted
  std::atomic<bool> shutdown_requested_{false};
  std::chrono::steady_clock::time_point shutdown_deadline_;
};

}  // namespace hvdlite
