#include "coordinator/steady_state.h"

#include <set>

namespace hvdlite {

// Replayable: an error-free collective of the global set whose every tensor
// is cached (so a rank can tell from its local cache that its request is
// unchanged), with no joined members. Join, barrier, process-set ops and
// shutdown never are (a barrier of the global set is skipped, see Observe).
bool ScheduleLearner::Replayable(const Response& r) {
  switch (r.type) {
    case OpType::kAllreduce:
    case OpType::kAllgather:
    case OpType::kBroadcast:
    case OpType::kAlltoall:
    case OpType::kReducescatter:
      break;
    default:
      return false;
  }
  if (r.error_code != StatusCode::kOk || r.process_set != 0 || !r.specs.empty() || r.names.empty() ||
      r.cache_ids.size() != r.names.size())
    return false;
  for (int32_t id : r.cache_ids) {
    if (id < 0) return false;
  }
  return true;
}

void ScheduleLearner::Observe(const Response& r, bool global) {
  // A barrier of the global set neither belongs to a schedule nor ends one:
  // schedule mode votes on barriers (steady_state.h).
  if (global && r.type == OpType::kBarrier && r.process_set == 0 && r.error_code == StatusCode::kOk) return;
  if (!global || !Replayable(r)) return Reset();
  ResponseList one;
  one.responses.push_back(r);
  keys_.push_back(Serialize(one));
  history_.push_back(r);
  while (history_.size() > 2 * max_period_) {
    history_.pop_front();
    keys_.pop_front();
  }
}

void ScheduleLearner::Reset() {
  history_.clear();
  keys_.clear();
}

bool ScheduleLearner::Period(std::vector<Response>* period) const {
  const size_t n = keys_.size();
  if (n < 2) return false;
  // Each name occurs once per period, so the period is the distance to the
  // last response's previous occurrence.
  size_t len = 0;
  for (size_t back = 1; back <= n / 2 && back <= max_period_; ++back) {
    if (keys_[n - 1 - back] == keys_[n - 1]) {
      len = back;
      break;
    }
  }
  if (len == 0) return false;
  for (size_t i = 0; i < len; ++i) {
    if (keys_[n - len + i] != keys_[n - 2 * len + i]) return false;
  }
  std::set<std::string> names;
  for (size_t i = n - len; i < n; ++i) {
    for (const std::string& name : history_[i].names) {
      if (!names.insert(name).second) return false;
    }
  }
  period->assign(history_.begin() + static_cast<std::ptrdiff_t>(n - len), history_.end());
  return true;
}

void SteadySchedule::Enter(int64_t epoch, std::vector<Response> groups) {
  active_ = !groups.empty();
  epoch_ = epoch;
  position_ = 0;
  groups_run_ = 0;
  groups_ = std::move(groups);
  ids_.clear();
  for (size_t k = 0; k < groups_.size(); ++k) {
    const Response& g = groups_[k];
    for (size_t i = 0; i < g.names.size(); ++i) ids_[g.names[i]] = {g.cache_ids[i], k};
  }
  votes_.erase(votes_.begin(), votes_.lower_bound(Slot{epoch, 0}));
}

void SteadySchedule::Leave() {
  active_ = false;
  groups_.clear();
  ids_.clear();
  votes_.erase(votes_.begin(), votes_.lower_bound(Slot{epoch_ + 1, 0}));
}

bool SteadySchedule::Find(const std::string& name, int32_t* cache_id, size_t* group) const {
  auto it = ids_.find(name);
  if (it == ids_.end()) return false;
  *cache_id = it->second.first;
  *group = it->second.second;
  return true;
}

SteadySchedule::Ballot& SteadySchedule::Tally(const Slot& at) {
  auto it = votes_.find(at);
  if (it == votes_.end()) {
    it = ballot_pool_.Insert(&votes_, [&](Slot& key) { key = at; });
    it->second.votes.assign(size_, -1);  // a recycled ballot keeps its vectors' capacity
    it->second.ready.resize(size_);
  }
  return it->second;
}

void SteadySchedule::Cast(const Slot& at, int rank, Vote v) {
  Ballot& b = Tally(at);
  if (b.votes[rank] >= 0) return;
  b.votes[rank] = v.ready ? kReadyVote : v.barrier ? kBarrierVote : kExitVote;
  if (v.ready) b.ready[rank] = std::move(v);
}

void SteadySchedule::OnVote(int peer, Vote v) {
  if (peer < 0 || peer >= size_) return;
  const bool over = v.epoch < epoch_ || (v.epoch == epoch_ && (!active_ || v.position < position_));
  if (over) return;
  const Slot at{v.epoch, v.position};
  Cast(at, peer, std::move(v));
}

void SteadySchedule::VoteSelf(bool ready) {
  Vote v;
  v.ready = ready;
  Cast(Slot{epoch_, position_}, rank_, std::move(v));
}

void SteadySchedule::VoteSelf(Vote own) { Cast(Slot{epoch_, position_}, rank_, std::move(own)); }

bool SteadySchedule::Voted(int rank) const {
  auto it = votes_.find(Slot{epoch_, position_});
  return it != votes_.end() && it->second.votes[rank] >= 0;
}

bool SteadySchedule::AnyVote() const {
  auto it = votes_.find(Slot{epoch_, position_});
  if (it == votes_.end()) return false;
  for (int8_t v : it->second.votes) {
    if (v >= 0) return true;
  }
  return false;
}

SteadySchedule::Outcome SteadySchedule::Decide() const {
  auto it = votes_.find(Slot{epoch_, position_});
  if (!active_ || it == votes_.end()) return Outcome::kWait;
  bool all = true, ready = false, barrier = false;
  for (int8_t v : it->second.votes) {
    if (v == kExitVote) return Outcome::kExit;
    all &= v >= 0;
    ready |= v == kReadyVote;
    barrier |= v == kBarrierVote;
  }
  if (!all) return Outcome::kWait;
  if (ready && barrier) return Outcome::kExit;  // the ranks are not at the same point
  return barrier ? Outcome::kBarrier : Outcome::kRun;
}

bool SteadySchedule::VotedInputs(std::vector<const char*>* parts) const {
  if (Decide() != Outcome::kRun) return false;
  const Ballot& b = votes_.find(Slot{epoch_, position_})->second;
  parts->clear();
  for (const Vote& v : b.ready) {
    if (v.input_size == 0 || v.input_size != b.ready[0].input_size) return false;
    parts->push_back(v.input());
  }
  return true;
}

void SteadySchedule::Advance() {
  const bool ran_group = Decide() != Outcome::kBarrier;
  auto it = votes_.find(Slot{epoch_, position_});
  if (it != votes_.end()) {
    for (Vote& v : it->second.ready) v = Vote();  // frees the inputs now, keeps the vector
    ballot_pool_.Erase(&votes_, it);
  }
  ++position_;
  if (ran_group) ++groups_run_;
}

}  // namespace hvdlite
