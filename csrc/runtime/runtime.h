// Runtime: the one object that owns a process's hvdlite state between init()
// and shutdown(): config, topology, transport, backend, coordinator (rank 0),
// tensor queue, handles, and the background thread that drives them.
//
// Threading: Enqueue/Wait/handles/queries may be called from any thread. The
// "engine" (transport, coordinator, executor, and the loop state below) is
// run by one thread at a time, the holder of engine_mu_ (runtime_engine.cc):
// the background thread by default, or a caller blocked in Wait(), which
// drives the engine itself until its handle completes while the background
// thread stands by. So on a small host a rank has one busy thread, and a
// short collective needs no thread wake-up at all.
// Failure: when the data or control plane fails (a peer died or hung), the
// runtime is "broken": every pending and later operation fails with that
// first error, naming the rank; shutdown() still works.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/gpu_backend.h"
#include "common/config.h"
#include "common/spin.h"
#include "coordinator/autotuner.h"
#include "coordinator/coordinator.h"
#include "coordinator/process_sets.h"
#include "coordinator/relay.h"
#include "coordinator/response_cache.h"
#include "coordinator/steady_state.h"
#include "runtime/bootstrap.h"
#include "runtime/executor.h"
#include "runtime/handles.h"
#include "runtime/p2p.h"
#include "runtime/steady_driver.h"
#include "runtime/tensor_queue.h"
#include "transport/transport.h"

namespace hvdlite {

class Runtime : private SteadyStateDriver::Host {
 public:
  // Reads the Config, bootstraps the job (blocking, bounded by
  // HVDLITE_START_TIMEOUT) and starts the background thread.
  static Status Create(std::unique_ptr<Runtime>* out);
  ~Runtime() override;

  const Topology& topology() const { return topo_; }
  const Config& config() const { return cfg_; }
  const char* cpu_backend_name() const { return backend_->name(); }
  // Any thread: the executor's counters, and (rank 0) the coordinator's.
  const Executor::Stats& executor_stats() const { return executor_->stats(); }
  const Coordinator* coordinator() const { return coordinator_.get(); }
  ProcessSetTable& process_sets() { return sets_; }
  HandleTable& handles() { return handles_; }

  // Submits an operation; `data` must stay valid until the handle completes.
  // Fails at once (no handle) when the runtime is broken or shut down, or the
  // name is already in flight. CUDA data (request.device >= 0) is read once
  // the work queued so far on `stream` is done (null = the legacy default stream).
  // `output` (may be null): the caller's buffer of `output_capacity` bytes for an operation's
  // result (TensorEntry::output).
  Status Enqueue(Request request, void* data, int64_t* handle, void* stream = nullptr, void* output = nullptr,
                 int64_t output_capacity = 0);
  // Posts a point-to-point send or receive (runtime/p2p.h); no coordinator
  // takes part. Fails at once like Enqueue, or for a bad process set or rank.
  // When the engine is free, the caller runs P2pEngine::Progress itself, so a
  // send leaves at once (bounded like every transfer: HVDLITE_TIMEOUT_SECONDS).
  Status PostP2p(P2pEngine::Op op, int64_t* handle);
  // Waits up to timeout_s for the handle's operation, driving the engine
  // meanwhile when it can take it over; the result is the operation's status,
  // Timeout when still pending, InvalidArgument for an unknown handle.
  // `lazy_token` (may be null): this wait is not registered with the deadlock
  // detector yet (BeginWait). Wait registers it, setting *lazy_token, only once
  // it has lasted kLazyWaitRegistration, before it blocks behind another
  // caller that drives, and before it returns with the handle pending: a
  // small operation that completes at once registers nothing.
  Status Wait(int64_t handle, double timeout_s, int64_t* lazy_token = nullptr);
  // Any thread: the caller is about to block until every one of `handles`
  // completes, and is done (EndWait with the token): the deadlock detector's
  // input (TensorQueue::BeginWait).
  int64_t BeginWait(const std::vector<int64_t>& handles) { return queue_.BeginWait(handles); }
  void EndWait(int64_t token) { queue_.EndWait(token); }
  // Blocks until every rank has called Shutdown (bounded by
  // HVDLITE_SHUTDOWN_TIMEOUT_SECONDS), then closes connections. Idempotent.
  Status Shutdown();
  // Starts/stops the Chrome-trace timeline; only rank 0 writes one (a no-op elsewhere).
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();

 private:
  using Clock = std::chrono::steady_clock;
  Runtime() = default;
  // Engine (runtime_engine.cc); every function below needs engine_mu_.
  void Loop();
  Status Turn();
  Status WaitForWork(Spinner* spin, int budget_ms, bool for_driver);
  bool Drive(int64_t handle, Clock::time_point until, Clock::time_point register_at, Status* result,
             int64_t* lazy_token);
  void RegisterWait(int64_t handle, int64_t* lazy_token);
  void StandBy(std::unique_lock<std::mutex>* engine);
  bool SpinYields() const;
  // Runtime (runtime.cc).
  Status HandleIncoming();
  Status FlushRelay();
  Status TakeResponses(const std::string& payload);
  void TakeResponse(Response r);
  Status Coordinate();
  Status CheckCoordinatorStays();
  int WaitBudgetMs(bool shutting_down);
  void Break(const Status& st);
  Status AdmitCudaTensor(const Request& request);
  Status LoadGpu(const std::string& what);  // the NCCL module, once per init(); `what` names the tensor
  void Leave();
  // SteadyStateDriver::Host (runtime.cc).
  Status SendNewRequests() override;
  Status DrainControl() override;
  bool ShuttingDown() const override { return shutdown_requested_.load(); }
  void ScheduleEnded() override;

  Config cfg_;
  Topology topo_;
  std::shared_ptr<void> bootstrap_keepalive_;  // e.g. the store rank 0 hosts under mpirun
  JobStore job_store_;                         // the store client; outlives gpu_
  GpuHost gpu_host_;                           // what the NCCL module gets (job_store_'s store)
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<NegotiationRelay> relay_;   // negotiation's way to and from rank 0 (the vote tree)
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<P2pEngine> p2p_;        // point-to-point; its engine part runs in Turn()
  std::mutex gpu_mu_;                     // guards loading the NCCL module
  std::unique_ptr<GpuBackend> gpu_;       // loaded on the first CUDA tensor; destroyed before executor_
  Status gpu_error_;                      // why loading failed, once it has
  std::unique_ptr<Autotuner> autotuner_;  // rank 0 only
  ProcessSetTable sets_;
  HandleTable handles_;
  TensorQueue queue_;
  LocalRequestCache local_cache_;
  Timeline timeline_;  // rank 0 only

  // Engine state (guarded by engine_mu_).
  std::mutex engine_mu_;
  std::vector<ControlMessage> incoming_;
  std::vector<Response> todo_;
  // Scratch reused every turn: the requests a turn takes from the queue
  // (TakeNew swaps its buffer with the queue's, so both keep their capacity).
  std::vector<Request> taken_;
  std::vector<NegotiationRelay::Delivery> relayed_;  // what a relay message held for this rank
  std::vector<NegotiationRelay::Outgoing> relay_out_;
  bool finished_ = false;       // every rank shut down: the background thread leaves
  bool engine_broken_ = false;  // Break() ran: nobody may run the engine again
  SpinBudget engine_spin_;      // how long the engine holder polls for work before sleeping
  // Steady state (guarded by engine_mu_ too); created with the executor.
  std::unique_ptr<SteadyStateDriver> steady_;
  // Hand-over between a driving caller and the background thread.
  std::atomic<int> drive_requests_{0};  // callers in Wait() that want or hold the engine
  std::mutex standby_mu_;
  std::condition_variable standby_cv_;
  Clock::time_point last_drive_end_;  // guarded by standby_mu_
  bool standby_end_ = false;          // guarded by standby_mu_: take the engine back now (PostP2p)

  std::thread thread_;
  std::mutex state_mu_;
  Status broken_;         // first fatal error, or "shut down"
  bool stopped_ = false;  // no new work is accepted
  std::atomic<bool> shutdown_requested_{false};
  std::chrono::steady_clock::time_point shutdown_deadline_;
};

}  // namespace hvdlite
