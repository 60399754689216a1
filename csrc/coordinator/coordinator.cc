#include "coordinator/coordinator.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "common/logging.h"
#include "coordinator/validation.h"

namespace hvdlite {
namespace {

bool Cacheable(OpType t) {
  return t != OpType::kAddProcessSet && t != OpType::kRemoveProcessSet && t != OpType::kShutdown;
}

}  // namespace

Coordinator::Coordinator(const Config& cfg, ProcessSetTable* sets, int world_size, Timeline* timeline,
                         NowFn now)
    : cfg_(cfg),
      now_(now ? std::move(now) : NowFn([] { return Clock::now(); })),
      sets_(sets),
      world_size_(world_size),
      pending_(sets),
      cache_(static_cast<size_t>(std::max<int64_t>(0, cfg.CACHE_CAPACITY))),
      timeline_(timeline),
      fusion_threshold_(cfg.FUSION_THRESHOLD),
      cycle_time_ms_(cfg.CYCLE_TIME) {}

int Coordinator::MsUntilDue() const {
  if (decided_.empty() || cycle_time_ms_ <= 0) return 1000;
  const auto due = decided_.front().at + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double, std::milli>(cycle_time_ms_));
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - now_()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(left + 1, 1000)));
}

namespace {
std::string NegotiatePhase(OpType t) {
  std::string s = std::string("NEGOTIATE_") + OpTypeName(t);
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

void Coordinator::Add(int lo, int hi, const RequestList& list) {
  for (int rank = lo; rank < hi; ++rank) cache_.Acknowledge(rank, list.cache_ack);
  for (const Request& in : list.requests) {
    if (in.cache_id >= 0) {
      AddHits(lo, hi, in.cache_id);
      continue;
    }
    for (int rank = lo; rank < hi; ++rank) {
      Request r = in;
      r.rank = rank;
      AddOne(std::move(r));
    }
  }
  if (list.has_waits) {
    for (int rank = lo; rank < hi; ++rank) {
      if (list.waits.empty()) {
        waits_.erase(rank);
      } else {
        waits_[rank] = list.waits;
      }
    }
  }
  // Checked once per Drain, not per Add: a cycle brings up to one list per
  // rank, and a check per list would cost O(ranks^2) per cycle.
  deadlock_check_due_ |= !waits_.empty() && (list.has_waits || !list.requests.empty());
}

void Coordinator::CheckDeadlock() {
  if (cfg_.DEADLOCK_CHECK_DISABLE) return;
  std::map<WaitKey, UndecidedTensor> undecided;
  pending_.AddWaitedFor(waits_, joined_ranks_, &undecided);
  AddReceives(waits_, [this](int32_t set) { return sets_->Ranks(set); }, &undecided);
  DeadlockReport report;
  if (!FindDeadlock(waits_, undecided, &report)) return;
  HVD_LOG(kError, report.message);
  for (const WaitKey& key : report.tensors) {
    if (key.p2p_src >= 0) {  // its receivers fail it (P2pEngine::FailDeadlocked)
      Request recv;          // what DecideError reads of it: type, name, set
      recv.type = OpType::kRecv, recv.name = key.name, recv.process_set = key.process_set;
      DecideError(recv, undecided.at(key).submitted, Status::Mismatch(report.message));
      decided_.back().response.first_dims = {key.p2p_src, key.tag};
      continue;
    }
    auto it = pending_.find({key.process_set, key.name});
    const Request& any = it->second.first;
    if (timeline_) timeline_->End(key.name, NegotiatePhase(any.type));
    DecideError(any, sets_->Ranks(key.process_set), Status::Mismatch(report.message));
    pending_.erase(it);
  }
}

void Coordinator::Push(Decided d) {
  d.at = now_();
  decided_.push_back(std::move(d));
}

// The slow path of a cache hit: the full request, through AddOne's checks.
void Coordinator::AddExpanded(int rank, int32_t id) {
  Request r;
  if (!cache_.Expand(id, rank, &r)) {
    HVD_LOG(kError, "rank " << rank << " sent unknown cache id " << id << "; dropped");
    return;
  }
  AddOne(std::move(r), id);
}

void Coordinator::AddHits(int lo, int hi, int32_t id) {
  const ResponseCache::Key* cached = cache_.KeyOf(id);
  if (cached == nullptr || !shutdown_ranks_.empty()) {
    for (int rank = lo; rank < hi; ++rank) AddExpanded(rank, id);
    return;
  }
  const ResponseCache::Key key = *cached;  // (a copy: deciding may evict the entry it points into)
  auto it = pending_.find(key);
  if (it == pending_.end()) {  // the first submission this cycle creates the tensor's entry
    AddExpanded(lo++, id);
    it = pending_.find(key);
  }
  if (lo == hi) return;
  const std::shared_ptr<const std::vector<int>> members =
      it == pending_.end() ? nullptr : sets_->Members(it->first.first);
  auto first =
      members ? std::lower_bound(members->begin(), members->end(), lo) : std::vector<int>::const_iterator();
  auto last = members ? std::lower_bound(first, members->end(), hi) : first;
  if (!members || last - first != hi - lo || members->size() != it->second.have.size()) {
    for (int rank = lo; rank < hi; ++rank) AddExpanded(rank, id);  // not all members: AddOne words it
    return;
  }
  const std::vector<int>& ranks = *members;
  for (auto pos = first; pos != last; ++pos) {
    const size_t member = static_cast<size_t>(pos - ranks.begin());
    it->second.Keep(member, id, nullptr);
    if (Submit(it, ranks, member, *pos)) {  // complete (or decided early, as joined ranks allow)
      for (auto rest = pos + 1; rest != last; ++rest) AddExpanded(*rest, id);
      return;
    }
  }
}

void Coordinator::AddOne(Request r, int32_t hit_id) {
  if (r.type == OpType::kShutdown) {
    OnShutdown(r.rank);
    return;
  }
  if (r.type == OpType::kJoin) {
    OnJoin(r.rank);
    return;
  }
  if (r.type == OpType::kAddProcessSet && r.process_set == kAmongMembers)
    r.process_set = StageAmongMembers(r);
  const std::shared_ptr<const std::vector<int>> members = sets_->Members(r.process_set);
  const std::vector<int>& ranks = *members;
  const Status admissible = CheckSubmission(r, ranks, shutdown_ranks_);
  if (!admissible.ok()) {
    DecideError(r, {r.rank}, admissible);
    return;
  }
  auto pos = std::lower_bound(ranks.begin(), ranks.end(), r.rank);
  bool opened = false;
  auto it = pending_.Open(r, ranks.size(), now_(), &opened);
  if (opened && timeline_) timeline_->Begin(r.name, NegotiatePhase(r.type));
  const size_t member = static_cast<size_t>(pos - ranks.begin());
  it->second.Keep(member, hit_id, &r);
  Submit(it, ranks, member, ranks[member]);
}

bool Coordinator::Submit(PendingTable::iterator it, const std::vector<int>& ranks, size_t member, int rank) {
  Pending& p = it->second;
  if (timeline_) timeline_->Mark(it->first.second, "READY", "\"rank\": " + std::to_string(rank));
  if (!p.Mark(member)) {
    // The runtime refuses a second submission of a name in flight, so this is
    // only reachable through a protocol bug; keep the first.
    HVD_LOG(kError, "rank " << rank << " submitted tensor '" << it->first.second << "' twice");
    return false;
  }
  if (!p.Ready(ranks, joined_ranks_)) return false;
  Decide(it->first, p);
  pending_.erase(it);
  return true;
}

bool Coordinator::DecideFromCache(const Pending& p, const std::vector<int>& ranks) {
  const int32_t id = p.SharedHit(ranks.size());
  if (id < 0) return false;
  const CachedDecision* cached = cache_.Replay(id, ranks.size());
  if (cached == nullptr) return false;
  Decided d;
  d.recipients = ranks;
  d.response = cached->response;
  d.fusion_key = cached->fusion_key;
  d.bytes = cached->bytes;
  Push(std::move(d));
  return true;
}

// join(): the rank has no more data. Tensors that now wait only for joined
// ranks run with identity contributions from them; when the last rank joins,
// every rank's join() returns that rank.
void Coordinator::OnJoin(int rank) {
  joined_ranks_.insert(rank);
  last_joined_ = rank;
  if (static_cast<int>(joined_ranks_.size()) == world_size_) {
    Decided d;
    for (int r = 0; r < world_size_; ++r) d.recipients.push_back(r);
    d.response.type = OpType::kJoin;
    d.response.names.push_back("__join__");
    d.response.cache_ids.push_back(-1);
    d.response.last_joined_rank = last_joined_;
    Push(std::move(d));
    joined_ranks_.clear();
    return;
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    std::vector<int> ranks = sets_->Ranks(it->first.first);
    if (it->second.Ready(ranks, joined_ranks_)) {
      Decide(it->first, it->second);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void Coordinator::Decide(const Key& key, Pending& p) {
  if (timeline_) timeline_->End(key.second, NegotiatePhase(p.first.type));
  std::vector<int> ranks = sets_->Ranks(key.first);
  if (DecideFromCache(p, ranks)) return;
  p.Materialize(ranks, cache_);
  std::vector<Request> submitted;
  std::vector<int> submitters, joined;
  p.Split(ranks, &submitted, &submitters, &joined);  // (Ready: every absent member has joined)
  const Request& r0 = submitted[0];
  Decided d;
  d.recipients = ranks;
  d.response.type = r0.type;
  d.response.process_set = WireSet(r0);
  d.response.names.push_back(r0.name);
  Status st = ValidateRequests(submitted, submitters, &d.response);
  if (st.ok() && !joined.empty()) st = CheckJoinedParticipation(r0, joined);
  if (!st.ok()) {
    DecideError(r0, ranks, st);
    return;
  }
  if (!joined.empty()) {
    // Joined members contribute identity values to a reduction; they learn
    // the tensor's signature from `specs`.
    d.response.specs.push_back(r0);
    d.response.cache_ids.push_back(-1);
    Push(std::move(d));
    return;
  }
  if (r0.type == OpType::kAddProcessSet && d.response.process_set == kAmongMembers) {
    d.response.new_set_id = r0.process_set;  // staged in the table already (StageAmongMembers)
    staged_sets_.erase(r0.name);
  } else if (r0.type == OpType::kAddProcessSet) {
    int32_t id = TakeSetId();
    std::vector<int> members(r0.set_members.begin(), r0.set_members.end());
    sets_->Add(id, members);
    d.response.new_set_id = id;
  } else if (r0.type == OpType::kRemoveProcessSet) {
    FailPendingOf(r0.target_set, sets_->Ranks(r0.target_set), key.first == r0.target_set ? key.second : "");
    if (r0.target_set != 0 && sets_->Exists(r0.target_set)) free_set_ids_.push_back(r0.target_set);
    sets_->Remove(r0.target_set);
  }
  if (r0.type == OpType::kAllreduce) {
    d.fusion_key = FusionKey(r0);
    d.bytes = TensorBytes(r0);
  }
  int32_t id = -1;
  if (Cacheable(r0.type)) {
    const CachedDecision replay{d.response, d.fusion_key, d.bytes};
    id = cache_.Bind(p.reqs, &replay);
  }
  d.response.cache_ids.push_back(id);
  Push(std::move(d));
}

void Coordinator::FailPendingOf(int32_t set, const std::vector<int>& ranks, const std::string& keep) {
  for (auto it = pending_.FirstOf(set); it != pending_.end() && it->first.first == set;) {
    if (it->first.second == keep) {
      ++it;  // the removal itself: its caller erases it
      continue;
    }
    const std::vector<int> submitted = it->second.Submitters(ranks);
    const Request& any = it->second.first;
    if (timeline_) timeline_->End(any.name, NegotiatePhase(any.type));
    DecideError(
        any, submitted,
        Status::Aborted(std::string(OpTypeName(any.type)) + " of tensor '" + any.name + "': process set " +
                        std::to_string(set) + " was removed before every member submitted it (ranks " +
                        JoinRanks(submitted) + " did)."));
    it = pending_.erase(it);
  }
}

int32_t Coordinator::StageAmongMembers(const Request& r) {
  auto it = staged_sets_.find(r.name);
  if (it != staged_sets_.end()) return it->second;
  const int32_t id = TakeSetId();
  std::vector<int> members(r.set_members.begin(), r.set_members.end());
  std::sort(members.begin(), members.end());
  sets_->Add(id, std::move(members));
  staged_sets_.emplace(r.name, id);
  return id;
}

int32_t Coordinator::WireSet(const Request& r) const {
  if (r.type != OpType::kAddProcessSet) return r.process_set;
  auto it = staged_sets_.find(r.name);
  return it != staged_sets_.end() && it->second == r.process_set ? kAmongMembers : r.process_set;
}

void Coordinator::DecideError(const Request& r, const std::vector<int>& recipients, const Status& st) {
  Decided d;
  d.recipients = recipients;
  d.response.type = r.type;
  d.response.process_set = WireSet(r);
  if (d.response.process_set == kAmongMembers && r.process_set != kAmongMembers) {
    // The registration failed: its staged set goes again, its id is free.
    staged_sets_.erase(r.name);
    sets_->Remove(r.process_set);
    free_set_ids_.push_back(r.process_set);
  }
  d.response.names.push_back(r.name);
  d.response.cache_ids.push_back(-1);
  d.response.error_code = st.code();
  d.response.error = st.message();
  Push(std::move(d));
}

// A rank that shuts down can no longer take part in collectives: every
// undecided tensor of a set that contains it fails on every member.
void Coordinator::OnShutdown(int rank) {
  shutdown_ranks_.insert(rank);
  waits_.erase(rank);
  for (auto it = pending_.begin(); it != pending_.end();) {
    std::vector<int> ranks = sets_->Ranks(it->first.first);
    if (!std::binary_search(ranks.begin(), ranks.end(), rank)) {
      ++it;
      continue;
    }
    const Request& any = it->second.first;
    DecideError(any, ranks,
                Status::Aborted(std::string(OpTypeName(any.type)) + " of tensor '" + any.name +
                                "' cannot run: rank " + std::to_string(rank) +
                                " has shut down before submitting it."));
    it = pending_.erase(it);
  }
}

bool Coordinator::Drain(std::vector<ResponseList>* per_rank) {
  std::vector<ListRun> runs;
  if (!DrainRuns(&runs)) return false;
  per_rank->assign(world_size_, ResponseList{});
  for (ListRun& run : runs) {
    for (int r = run.lo; r < run.hi; ++r) (*per_rank)[r] = run.list;
  }
  return true;
}

bool Coordinator::DrainRuns(std::vector<ListRun>* runs) {
  if (deadlock_check_due_) {
    deadlock_check_due_ = false;
    if (!waits_.empty()) CheckDeadlock();
  }
  bool announce = AllRanksShutDown() && !shutdown_announced_;
  if (decided_.empty() && !announce) return false;  // (every turn in the steady state: no allocation)
  if (!announce && cycle_time_ms_ > 0 && MsUntilDue() > 0) return false;  // hold for fusion
  std::vector<Decided> fused = Fuse(&decided_, fusion_threshold_);
  std::vector<CacheEviction> evictions = cache_.TakeEvictions();
  *runs = BuildListRuns(world_size_, &fused, &evictions, cache_.eviction_seq(), announce);
  cache_entries_.store(static_cast<int64_t>(cache_.size()), std::memory_order_relaxed);
  cache_evictions_.store(cache_.eviction_seq(), std::memory_order_relaxed);
  if (announce) {
    shutdown_announced_ = true;
  } else {
    MaybeAnnounce(fused, runs);
  }
  return true;
}

// Only when nothing is undecided here: a request that a rank sent before it
// receives the schedule then makes that rank vote exit(0) (its own requests
// are the only ones it knows of), so no schedule runs next to a negotiation.
void Coordinator::MaybeAnnounce(const std::vector<Decided>& fused, std::vector<ListRun>* runs) {
  if (!cfg_.STEADY_STATE || world_size_ < 2) return;
  for (const auto& d : fused)
    learner_.Observe(d.response, static_cast<int>(d.recipients.size()) == world_size_);
  if (schedule_active_ || !schedule_allowed_ || !pending_.empty() || !decided_.empty() ||
      !joined_ranks_.empty() || !shutdown_ranks_.empty())
    return;
  std::vector<Response> groups;
  if (!learner_.Period(&groups)) return;
  schedule_active_ = true;
  learner_.Reset();
  ++schedule_epoch_;
  for (auto& run : *runs) {
    run.list.schedule_epoch = schedule_epoch_;
    run.list.schedule = groups;
  }
}

int Coordinator::CheckStalls() {
  if (cfg_.STALL_CHECK_DISABLE || pending_.empty()) return 1000;
  const auto now = now_();
  const auto warn_after = std::chrono::duration<double>(cfg_.STALL_CHECK_TIME_SECONDS);
  const auto fail_after = std::chrono::duration<double>(cfg_.STALL_SHUTDOWN_TIME_SECONDS);
  // Once one tensor reaches the stall shutdown time, every tensor stalled past
  // the warning time fails with it: diverged ranks submit their collectives
  // moments apart, and each must learn of the stall, not of a peer that shut
  // down after its own error.
  const bool failing = cfg_.STALL_SHUTDOWN_TIME_SECONDS > 0 && pending_.AnyWaited(now, fail_after);
  const auto fail_now = std::min(fail_after, warn_after);
  std::vector<Key> failed;  // erased after the loop: DescribeWaits sees every rank's submission
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    Pending& p = it->second;
    std::vector<int> ranks = sets_->Ranks(it->first.first), missing, ready;
    p.Partition(ranks, &ready, &missing);
    const double waited = std::chrono::duration<double>(now - p.first_seen).count();
    if (failing && now - p.first_seen >= fail_now) {
      std::ostringstream os;
      os << "tensor '" << it->first.second << "' stalled for " << static_cast<int>(waited) << " s: ranks "
         << JoinRanks(missing) << " never submitted it (ranks " << JoinRanks(ready)
         << " did): " << pending_.DescribeWaits(ranks)
         << ". Make every rank run the same collectives, or raise HVDLITE_STALL_SHUTDOWN_TIME_SECONDS.";
      DecideError(p.first, ranks, Status::Timeout(os.str()));
      failed.push_back(it->first);
      continue;
    }
    if (now - p.last_warned >= warn_after) {
      p.last_warned = now;
      HVD_LOG(kWarning, "Stalled tensor '" << it->first.second << "' (process set " << it->first.first
                                           << "): waiting " << static_cast<int>(waited) << " s for ranks "
                                           << JoinRanks(missing) << " to submit it; ranks "
                                           << JoinRanks(ready)
                                           << " are ready: " << pending_.DescribeWaits(ranks)
                                           << ". One or more ranks may have diverged (different collectives "
                                           << "or names) or be stuck.");
    }
  }
  for (const Key& key : failed) pending_.erase(key);
  return static_cast<int>(std::min(1000.0, std::max(10.0, cfg_.STALL_CHECK_TIME_SECONDS * 1000 / 4)));
}

}  // namespace hvdlite
