#include "runtime/runtime.h"

#include <algorithm>

#include "common/logging.h"
#include "runtime/affinity.h"

namespace hvdlite {

Status Runtime::Create(std::unique_ptr<Runtime>* out) {
  std::unique_ptr<Runtime> rt(new Runtime());
  HVD_RETURN_IF_ERROR(Config::FromEnv(&rt->cfg_));
  SetLogLevel(rt->cfg_.LOG_LEVEL);
  HVD_RETURN_IF_ERROR(
      Bootstrap(rt->cfg_, &rt->topo_, &rt->transport_, &rt->bootstrap_keepalive_, &rt->job_store_));
  rt->gpu_host_ =
      GpuHost{rt->job_store_.store.get(), rt->job_store_.prefix + "nccl/", rt->cfg_.START_TIMEOUT};
  SetLogRank(rt->topo_.rank);
  if (rt->cfg_.PIN_CORES) PinToCoreIfHostIsFull(rt->topo_);
  HVD_RETURN_IF_ERROR(CreateCpuBackend(rt->cfg_, rt->transport_.get(), rt->topo_.host_of, &rt->backend_));
  rt->sets_.Reset(rt->topo_.size);
  rt->relay_.reset(new NegotiationRelay(rt->topo_.rank, rt->topo_.size));
  rt->engine_spin_ = SpinBudget(rt->SpinYields() ? rt->cfg_.SPIN_US * kYieldSpinFactor : rt->cfg_.SPIN_US);
  Timeline* timeline = rt->topo_.rank == 0 ? &rt->timeline_ : nullptr;
  if (timeline && !rt->cfg_.TIMELINE.empty()) {
    HVD_RETURN_IF_ERROR(rt->timeline_.Start(rt->cfg_.TIMELINE, rt->cfg_.TIMELINE_MARK_CYCLES));
  }
  if (rt->topo_.rank == 0) {
    rt->coordinator_.reset(new Coordinator(rt->cfg_, &rt->sets_, rt->topo_.size, timeline));
    rt->autotuner_.reset(new Autotuner(rt->cfg_));
  }
  rt->executor_.reset(new Executor(rt->topo_.rank, rt->backend_.get(), &rt->sets_, &rt->handles_, &rt->queue_,
                                   &rt->local_cache_, timeline));
  rt->p2p_.reset(new P2pEngine(rt->topo_.rank, rt->transport_.get(), &rt->sets_, &rt->handles_, &rt->queue_,
                               rt->cfg_.TIMEOUT_SECONDS, rt->cfg_.P2P_UNEXPECTED_BYTES));
  SteadyStateDriver::Parts parts;
  parts.cfg = &rt->cfg_;
  parts.topo = &rt->topo_;
  parts.transport = rt->transport_.get();
  parts.executor = rt->executor_.get();
  parts.queue = &rt->queue_;
  parts.cache = &rt->local_cache_;
  parts.timeline = &rt->timeline_;
  parts.host = rt.get();
  rt->steady_.reset(new SteadyStateDriver(parts));
  rt->thread_ = std::thread([r = rt.get()] { r->Loop(); });
  *out = std::move(rt);
  return Status::OK();
}

Runtime::~Runtime() { Shutdown(); }

// The first CUDA tensor loads the NCCL module; an operation the module lacks,
// or a failure to load it, fails at once on this rank, before negotiation.
Status Runtime::AdmitCudaTensor(const Request& request) {
  if (request.type != OpType::kAllreduce && request.type != OpType::kBroadcast) {
    return Status::NotSupported(
        std::string(OpTypeName(request.type)) + " of CUDA tensor '" + request.name +
        "' is not supported yet (CUDA tensors: allreduce, grouped allreduce and broadcast); "
        "copy the tensor to the CPU first");
  }
  return LoadGpu("CUDA tensor '" + request.name + "'");
}

Status Runtime::LoadGpu(const std::string& what) {
  std::lock_guard<std::mutex> lock(gpu_mu_);
  if (gpu_) return Status::OK();
  if (gpu_error_.ok()) gpu_error_ = LoadGpuBackend(&gpu_host_, &gpu_);  // tried once per init()
  if (!gpu_error_.ok()) return gpu_error_.WithContext(what);
  executor_->SetGpuBackend(gpu_.get());
  p2p_->SetGpu(gpu_.get());
  return Status::OK();
}

Status Runtime::Enqueue(Request request, void* data, int64_t* handle, void* stream, void* output,
                        int64_t output_capacity) {
  if (request.device >= 0) HVD_RETURN_IF_ERROR(AdmitCudaTensor(request));
  std::lock_guard<std::mutex> lock(state_mu_);
  if (stopped_) {
    return broken_.WithContext(std::string("cannot run ") + OpTypeName(request.type) + " of tensor '" +
                               request.name + "'");
  }
  if (timeline_.Active()) timeline_.Begin(request.name, "QUEUE");
  TensorEntry e;
  e.request = std::move(request);
  e.request.rank = topo_.rank;
  e.data = data;
  e.stream = stream;
  e.output = output;
  e.output_capacity = output_capacity;
  e.handle = handles_.Create();
  const int64_t h = e.handle;
  Status st = queue_.Push(std::move(e));
  if (!st.ok()) {
    handles_.Release(h);
    return st;
  }
  *handle = h;
  return Status::OK();
}

Status Runtime::PostP2p(P2pEngine::Op op, int64_t* handle) {
  if (op.device >= 0) HVD_RETURN_IF_ERROR(LoadGpu("CUDA tensor '" + op.name + "'"));
  bool large_send = false;
  {
    std::lock_guard<std::mutex> lock(state_mu_);  // so Break() fails the handle if it runs after this
    if (stopped_) {
      return broken_.WithContext(std::string(op.send ? "cannot send" : "cannot receive") + " tensor '" +
                                 op.name + "'");
    }
    HVD_RETURN_IF_ERROR(p2p_->Post(std::move(op), handle, &large_send));
  }
  // Start the transfer from this thread when the engine is free (the background thread
  // stands by after a caller drove, for up to kStandByGrace: a send would wait that long);
  // otherwise its holder takes it up (HasNew, after Post's seq_cst count; Kick wakes a sleeper).
  // A send that would wait for the peer (P2pEngine::Post) is the background thread's even
  // then: its chunks fill the peer's control channel, and sending them blocks until the
  // peer's engine drains it, which this caller would wait for instead of computing while
  // they travel. One through the shared-memory arena costs this thread a copy, not a wait.
  // A send this thread could not finish (the arena had no room for all of it) is handed over
  // the same way.
  auto hand_over = [this] {
    {
      std::lock_guard<std::mutex> lock(standby_mu_);
      standby_end_ = true;
    }
    standby_cv_.notify_one();
    queue_.Kick();
    return Status::OK();
  };
  if (large_send) return hand_over();
  std::unique_lock<std::mutex> engine(engine_mu_, std::try_to_lock);
  if (!engine.owns_lock()) {
    queue_.Kick();
    return Status::OK();
  }
  if (engine_broken_ || finished_) return Status::OK();  // the handle has failed or will
  Status st = p2p_->Progress();
  if (!st.ok()) Break(st);
  if (st.ok() && p2p_->SendsQueued()) {
    engine.unlock();
    return hand_over();
  }
  return Status::OK();
}

Status Runtime::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!stopped_) {
      stopped_ = true;
      broken_ = Status::Aborted("hvdlite has been shut down; call init() again to run more collectives");
      shutdown_deadline_ = std::chrono::steady_clock::now() +
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(cfg_.SHUTDOWN_TIMEOUT_SECONDS));
      TensorEntry bye;
      bye.request.type = OpType::kShutdown;
      bye.request.name = "__shutdown__";
      bye.request.rank = topo_.rank;
      queue_.Push(bye);
      shutdown_requested_ = true;
    }
  }
  {
    std::lock_guard<std::mutex> lock(standby_mu_);
    standby_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  return Status::OK();
}

Status Runtime::StartTimeline(const std::string& path, bool mark_cycles) {
  if (topo_.rank != 0) return Status::OK();
  return timeline_.Start(path, mark_cycles);
}

void Runtime::StopTimeline() { timeline_.Stop(); }

Status Runtime::SendNewRequests() {
  std::vector<Request> fresh;
  RequestList list;
  if (cfg_.DEADLOCK_CHECK_DISABLE) {
    queue_.TakeNew(&fresh);
  } else {
    queue_.TakeNew(&fresh, &list.waits, &list.has_waits);
  }
  steady_->TakeHeld(&fresh, &list.waits, &list.has_waits);  // held in schedule mode, which this rank left
  if (fresh.empty() && !list.has_waits) return Status::OK();
  list.cache_ack = local_cache_.acked();
  if (timeline_.Active() && timeline_.MarkCycles()) timeline_.Mark("", "CYCLE_START");
  for (auto& r : fresh) {
    if (timeline_.Active()) timeline_.End(r.name, "QUEUE");
    local_cache_.Compact(&r);
    list.requests.push_back(std::move(r));
  }
  if (coordinator_) {
    coordinator_->Add(0, list);
    return Status::OK();
  }
  relay_->Up(topo_.rank, Serialize(list), &relayed_);  // (delivers nothing here: not rank 0)
  return FlushRelay();
}

// Sends what the relay queued: one message to the parent, one per child.
// A departed peer gets nothing (CheckCoordinatorStays handles a departed parent).
Status Runtime::FlushRelay() {
  if (!relay_->HasOutgoing()) return Status::OK();
  relay_->TakeOutgoing(&relay_out_);
  for (const NegotiationRelay::Outgoing& out : relay_out_) {
    if (transport_->PeerDeparted(out.peer)) continue;
    HVD_RETURN_IF_ERROR(transport_->SendControl(out.peer, out.wire));
  }
  relay_out_.clear();
  return Status::OK();
}

// A ResponseList for this rank, from rank 0 through the relay.
Status Runtime::TakeResponses(const std::string& payload) {
  ResponseList list;
  HVD_RETURN_IF_ERROR(Deserialize(payload, &list).WithContext("from rank 0"));
  for (auto& r : list.responses) TakeResponse(std::move(r));
  local_cache_.QueueEvictions(list.evicted_cache_ids, list.eviction_seq);
  finished_ |= list.shutdown;
  steady_->Announce(list.schedule_epoch, std::move(list.schedule));
  return Status::OK();
}

// A deadlocked point-to-point receive fails in the engine at once; the
// rest run in order (todo_).
void Runtime::TakeResponse(Response r) {
  if (r.type == OpType::kRecv && r.names.size() == 1 && r.first_dims.size() == 2) {
    p2p_->FailDeadlocked(r.process_set, r.names[0], static_cast<int>(r.first_dims[0]),
                         static_cast<int32_t>(r.first_dims[1]), Status(r.error_code, r.error));
    return;
  }
  todo_.push_back(std::move(r));
}

// Relay messages (negotiation, coordinator/relay.h) and votes. Rank 0 takes
// the requests relayed to it into the coordinator; the other ranks take their
// responses; what is for others goes on at the end.
Status Runtime::HandleIncoming() {
  for (auto& msg : incoming_) {
    const ControlKind kind = PeekControlKind(msg.payload);
    if (kind == ControlKind::kRelay) {
      relayed_.clear();
      HVD_RETURN_IF_ERROR(relay_->OnMessage(msg.peer, msg.payload, &relayed_));
      for (const NegotiationRelay::Delivery& d : relayed_) {
        if (coordinator_) {
          RequestList list;
          const std::string from = d.hi - d.rank > 1
                                       ? "ranks " + std::to_string(d.rank) + "-" + std::to_string(d.hi - 1)
                                       : "rank " + std::to_string(d.rank);
          HVD_RETURN_IF_ERROR(Deserialize(d.payload, &list).WithContext("from " + from));
          coordinator_->Add(d.rank, d.hi, list);  // a run of ranks that sent the same list
        } else {
          HVD_RETURN_IF_ERROR(TakeResponses(d.payload));
        }
      }
    } else if (kind == ControlKind::kVote) {
      HVD_RETURN_IF_ERROR(steady_->OnVoteMessage(msg.peer, std::move(msg.payload)));
    } else if (P2pEngine::Owns(msg.payload)) {
      HVD_RETURN_IF_ERROR(p2p_->OnControl(msg.peer, msg.payload));
    } else {
      return Status::Internal("unexpected control message from rank " + std::to_string(msg.peer));
    }
  }
  incoming_.clear();
  relayed_.clear();
  return FlushRelay();
}

Status Runtime::DrainControl() {
  HVD_RETURN_IF_ERROR(transport_->WaitControl(-1, 0, &incoming_));
  return HandleIncoming();
}

void Runtime::ScheduleEnded() {
  if (coordinator_) coordinator_->EndSchedule();
}

// Rank 0: turn what every rank has submitted into responses, send each rank
// its share, and keep this rank's own share to execute.
Status Runtime::Coordinate() {
  std::vector<ListRun> runs;
  coordinator_->CheckStalls();
  if (!coordinator_->DrainRuns(&runs)) return Status::OK();
  relayed_.clear();
  for (const ListRun& run : runs) {  // each distinct list is serialized once
    const ResponseList& l = run.list;
    if (run.hi <= 1 ||
        (l.responses.empty() && !l.shutdown && l.evicted_cache_ids.empty() && l.schedule.empty()))
      continue;
    const std::string wire = Serialize(l);
    int lo = std::max(run.lo, 1);
    for (int r = lo; r < run.hi; ++r) {  // departed ranks split the run
      if (!transport_->PeerDeparted(r)) continue;
      if (r > lo) relay_->Down(lo, r, wire, &relayed_);
      lo = r + 1;
    }
    if (lo < run.hi) relay_->Down(lo, run.hi, wire, &relayed_);
  }
  HVD_RETURN_IF_ERROR(FlushRelay());
  ResponseList& mine = runs.front().list;  // runs start at rank 0
  for (auto& resp : mine.responses) TakeResponse(std::move(resp));
  local_cache_.QueueEvictions(mine.evicted_cache_ids, mine.eviction_seq);
  steady_->Announce(mine.schedule_epoch, std::move(mine.schedule));
  return Status::OK();
}

// Ranks other than 0 (engine holder; never blocks): rank 0 departed (its
// shutdown gave up waiting for this rank) without announcing the end of the
// job, or this rank's relay to it (its vote-tree parent) did, having seen rank
// 0 go: nothing this rank submits can be decided any more: transports treat
// a departed peer's close as orderly, so without this check every wait here
// would last forever. Whatever rank 0 sent before its DEPART is taken in and
// run first. Then: leave, when this rank is shutting down too; otherwise an
// error that fails every pending and later operation (Break). Either way this
// rank departs, so the ranks still here blame rank 0 for the end of the job,
// not this rank's closing connections (its children notice it departed, and
// leave the same way).
Status Runtime::CheckCoordinatorStays() {
  if (coordinator_ || finished_ || transport_->departures() == 0 ||
      !transport_->PeerDeparted(relay_->parent()))
    return Status::OK();
  HVD_RETURN_IF_ERROR(transport_->WaitControl(-1, 0, &incoming_));
  HVD_RETURN_IF_ERROR(HandleIncoming());
  Status st;
  for (size_t i = 0; st.ok() && i < todo_.size(); ++i) st = executor_->Execute(todo_[i]);
  todo_.clear();
  HVD_RETURN_IF_ERROR(st);
  if (finished_ || shutdown_requested_.load()) {
    finished_ = true;
    return Status::OK();
  }
  transport_->Depart();  // bounded: at most min(HVDLITE_TIMEOUT_SECONDS, 2 s)
  const int parent = relay_->parent();
  const std::string relay =
      parent == 0 ? ""
                  : ", or rank " + std::to_string(parent) + " that relays this rank's negotiation to it,";
  return Status::Aborted("rank 0 (the coordinator)" + relay + " has shut down and left the job while rank " +
                         std::to_string(topo_.rank) +
                         " was still running collectives (did rank 0 raise, return or call shutdown() "
                         "early?); call shutdown() and then init() on every rank to start a new job");
}

int Runtime::WaitBudgetMs(bool shutting_down) {
  int budget = 1000;  // idle: wake once a second at most (stall checks)
  if (!cfg_.DEADLOCK_CHECK_DISABLE) budget = std::min(budget, queue_.MsUntilWaitReport());
  if (coordinator_) budget = std::min({budget, coordinator_->CheckStalls(), coordinator_->MsUntilDue()});
  budget = std::min(budget, steady_->BudgetMs());
  if (p2p_->DeviceBusy()) budget = std::min(budget, 1);  // polls the GPU's point-to-point transfers
  if (shutting_down) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(shutdown_deadline_ -
                                                                      std::chrono::steady_clock::now())
                    .count();
    budget = static_cast<int>(std::max<long long>(0, std::min<long long>(budget, left)));
  }
  return budget;
}

// Fatal error (engine holder): fail everything, close every connection so
// the other ranks learn of it at once, and accept no more work.
void Runtime::Break(const Status& st) {
  if (engine_broken_) return;
  engine_broken_ = true;
  timeline_.Stop();
  HVD_LOG(kError, "hvdlite stopped: " << st.message());
  const std::string advice = ". The job can no longer run collectives: restart it (every rank).";
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!stopped_) {
      stopped_ = true;
      broken_ = Status(st.code(), st.message() + advice);
    }
  }
  for (auto& e : queue_.TakeAll()) {
    HandleResult r;
    r.status = st.WithContext(std::string(OpTypeName(e.request.type)) + " of tensor '" + e.request.name +
                              "' failed");
    r.status = Status(r.status.code(), r.status.message() + advice);
    handles_.Complete(e.handle, std::move(r));
  }
  handles_.FailAll(Status(st.code(), st.message() + advice));
  transport_->Close();
}

// Orderly exit: fail what is left, tell every peer we are leaving on purpose,
// give them a moment to read it, then close.
void Runtime::Leave() {
  timeline_.Stop();
  Status bye = Status::Aborted("hvdlite has been shut down before this operation completed");
  for (auto& e : queue_.TakeAll()) {
    HandleResult r;
    r.status = bye;
    handles_.Complete(e.handle, std::move(r));
  }
  handles_.FailAll(bye);
  transport_->Depart();
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::vector<ControlMessage> ignored;
  while (std::chrono::steady_clock::now() < until) {
    bool all_gone = true;
    for (int r = 0; r < topo_.size; ++r) {
      all_gone &= (r == topo_.rank || !transport_->Connected(r) || transport_->PeerDeparted(r));
    }
    if (all_gone) break;
    if (!transport_->WaitControl(-1, 50, &ignored).ok()) break;
    ignored.clear();
  }
  transport_->Close();
}

}  // namespace hvdlite
