// The engine: the background loop, and callers that drive it from Wait().
//
// One thread at a time runs the engine: the holder of engine_mu_.
//  * The background thread holds it by default. Between turns it waits for
//    work (WaitForWork): it polls the submission counter and the transport's
//    control plane without syscalls for the spin budget (at most
//    HVDLITE_SPIN_US, adapted: common/spin.h), then sleeps in the transport
//    with the queue's eventfd armed.
//  * A caller in Wait() whose operation is not done registers in
//    drive_requests_ and kicks the eventfd (a syscall only if the background
//    thread sleeps). The background thread notices after its current turn or
//    at once while it waits, and stands by (StandBy): it releases engine_mu_
//    and parks. The caller then runs the same turns and waits itself (Drive)
//    until its handle is done or its time slice ends.
//  * A parked background thread takes the engine back once no caller has
//    driven for kStandByGrace (checked every grace period; at shutdown, as
//    soon as no caller drives).
//    Callers that wait once tend to wait again soon (a training loop, a
//    benchmark); keeping the background thread parked in between means the
//    hand-over costs nothing on the next operation. The price: work that
//    arrives while nobody drives (another rank's request to this rank's
//    coordinator, asynchronous submissions nobody waits for) may sit for up
//    to the grace period.
//  * Whoever holds the engine when it fails calls Break() (engine_broken_);
//    the background thread alone leaves the loop (Leave) when the job ends.
#include <unistd.h>

#include "common/logging.h"
#include "runtime/runtime.h"

namespace hvdlite {
namespace {

constexpr auto kStandByGrace = std::chrono::milliseconds(2);
// A wait registers with the deadlock detector only after this long (Wait's
// lazy_token): far below the detector's report delay and the steady state's
// patience, far above a small operation's whole time.
constexpr auto kLazyWaitRegistration = std::chrono::microseconds(20);

}  // namespace

void Runtime::Loop() {
  std::unique_lock<std::mutex> engine(engine_mu_);
  Spinner spin(&engine_spin_, SpinYields());
  for (;;) {
    if (engine_broken_) return;  // a driving caller already failed everything
    Status st = finished_ ? Status::OK() : Turn();
    if (!st.ok()) return Break(st);
    if (finished_) return Leave();
    const bool shutting_down = shutdown_requested_.load();
    if (shutting_down && Clock::now() >= shutdown_deadline_) {
      HVD_LOG(kWarning, "shutdown: not every rank called shutdown() within " << cfg_.SHUTDOWN_TIMEOUT_SECONDS
                                                                             << " s; leaving anyway");
      return Leave();
    }
    if (drive_requests_.load() > 0) {
      StandBy(&engine);
      spin.Reset();
      continue;
    }
    timeline_.Flush();  // about to wait: what happened so far is readable in the file
    st = WaitForWork(&spin, WaitBudgetMs(shutting_down), /*for_driver=*/false);
    if (!st.ok()) return Break(st);
  }
}

// One pass: send new requests, take in control messages, coordinate (rank
// 0), and execute every response decided so far.
// In steady-state schedule mode, new submissions are held instead of sent, and
// the schedule's positions run as the votes allow (steady_driver.h); a
// schedule announced with this turn's responses starts once they have run.
Status Runtime::Turn() {
  if (steady_->active()) {
    steady_->HoldNewRequests();
  } else {
    HVD_RETURN_IF_ERROR(SendNewRequests());
  }
  HVD_RETURN_IF_ERROR(HandleIncoming());
  HVD_RETURN_IF_ERROR(p2p_->Progress());  // point-to-point: no coordinator, no schedule
  if (steady_->active()) HVD_RETURN_IF_ERROR(steady_->Run());
  if (coordinator_) {
    coordinator_->AllowSchedule(!(autotuner_ && autotuner_->tuning()));
    HVD_RETURN_IF_ERROR(Coordinate());
    finished_ |= coordinator_->AllRanksShutDown();
  }
  Status st;
  const int64_t bytes_before = executor_->allreduce_bytes();
  const int responses_before = executor_->allreduce_responses();
  for (size_t i = 0; st.ok() && i < todo_.size(); ++i) st = executor_->Execute(todo_[i]);
  todo_.clear();
  local_cache_.ApplyEvictions();  // after the responses that may have bound the evicted ids
  if (autotuner_ && autotuner_->tuning()) {
    autotuner_->Record(executor_->allreduce_bytes() - bytes_before,
                       executor_->allreduce_responses() - responses_before);
    coordinator_->SetFusionThreshold(autotuner_->fusion_threshold());
    coordinator_->SetCycleTimeMs(autotuner_->cycle_time_ms());
  }
  if (st.ok()) st = steady_->EnterAnnounced();
  return st.ok() ? CheckCoordinatorStays() : st;
}

// Returns when there may be something to do: new submissions, control
// messages, (background thread) a caller asking for the engine, or after at
// most budget_ms. Polls for the spin budget, then sleeps in the transport.
Status Runtime::WaitForWork(Spinner* spin, int budget_ms, bool for_driver) {
  auto wanted = [&] {
    return queue_.HasNew() || p2p_->HasNew() || (!for_driver && drive_requests_.load() > 0);
  };
  for (;;) {
    if (wanted()) break;
    HVD_RETURN_IF_ERROR(transport_->WaitControl(-1, 0, &incoming_));
    if (!incoming_.empty()) break;
    if (spin->Spin()) continue;
    queue_.SetSleeping(true);
    Status st;
    if (!wanted()) {
      st = transport_->WaitControl(queue_.wake_fd(), budget_ms, &incoming_);
      queue_.ClearWake();
    }
    queue_.SetSleeping(false);
    spin->Reset();
    return st;
  }
  spin->Reset();
  return Status::OK();
}

// Background thread: lets callers drive (see the top of this file).
void Runtime::StandBy(std::unique_lock<std::mutex>* engine) {
  engine->unlock();
  {
    std::unique_lock<std::mutex> lock(standby_mu_);
    for (;;) {
      const Clock::time_point now = Clock::now();
      const bool grace_over =
          standby_end_ || shutdown_requested_.load() || now >= last_drive_end_ + kStandByGrace;
      if (drive_requests_.load() == 0 && grace_over) break;
      standby_cv_.wait_until(lock, std::max(now, last_drive_end_) + kStandByGrace);
    }
    standby_end_ = false;
  }
  engine->lock();
}

void Runtime::RegisterWait(int64_t handle, int64_t* lazy_token) {
  if (lazy_token != nullptr && *lazy_token == 0) *lazy_token = queue_.BeginWait({handle});
}

Status Runtime::Wait(int64_t handle, double timeout_s, int64_t* lazy_token) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  Status result;
  bool known = false;
  if (handles_.Done(handle, &result, &known)) return result;
  if (!known) return Status::InvalidArgument("unknown handle " + std::to_string(handle));
  drive_requests_.fetch_add(1);
  queue_.Kick();
  bool done = false;
  {
    std::unique_lock<std::mutex> engine(engine_mu_, std::try_to_lock);
    if (!engine.owns_lock()) {  // held by the background thread until it stands by, or by another caller
      RegisterWait(handle, lazy_token);
      engine.lock();
    }
    done = Drive(handle, until, start + kLazyWaitRegistration, &result, lazy_token);
  }
  drive_requests_.fetch_sub(1);
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(standby_mu_);
    last_drive_end_ = now;
  }
  if (done) return result;
  RegisterWait(handle, lazy_token);
  return handles_.Wait(handle, std::max(0.0, std::chrono::duration<double>(until - now).count()));
}

// A caller runs the engine until `handle` is done (true, with its *result),
// the handle is unknown, the engine can no longer run, or `until` passes
// (false: Wait asks the handle table). From `register_at` on, the wait is
// registered with the deadlock detector (RegisterWait).
bool Runtime::Drive(int64_t handle, Clock::time_point until, Clock::time_point register_at, Status* result,
                    int64_t* lazy_token) {
  Spinner spin(&engine_spin_, SpinYields());
  uint64_t seen = ~uint64_t{0};
  for (;;) {
    if (engine_broken_ || finished_) return false;
    const uint64_t completions = handles_.completions();
    if (completions != seen) {
      seen = completions;
      bool known = false;
      if (handles_.Done(handle, result, &known)) return true;
      if (!known) return false;
    }
    Status st = Turn();
    if (st.ok() && handles_.completions() != seen) continue;  // look at the handle first
    const Clock::time_point now = Clock::now();
    if (now >= register_at) RegisterWait(handle, lazy_token);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
    if (st.ok() && left <= 0) return false;
    if (st.ok()) {
      const int budget =
          static_cast<int>(std::min<long long>(left, WaitBudgetMs(shutdown_requested_.load())));
      st = WaitForWork(&spin, budget, /*for_driver=*/true);
    }
    if (!st.ok()) {
      Break(st);
      return false;
    }
  }
}

// Yield while spinning when this host has more ranks than cores. (sysconf
// reads sysfs: ask once.)
bool Runtime::SpinYields() const {
  static const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 && topo_.local_size > cpus;
}

}  // namespace hvdlite
