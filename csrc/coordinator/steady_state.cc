#include "coordinator/steady_state.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace hvdlite {
namespace {

// The header fields of a vote-tree message about position `at` (epoch, position); no payload.
VoteMessage VoteHeader(VoteMessage::Type type, const std::pair<int64_t, int64_t>& at, uint8_t outcome,
                       uint32_t input_size) {
  VoteMessage m;
  m.type = type;
  m.epoch = at.first;
  m.position = at.second;
  m.outcome = outcome;
  m.input_size = input_size;
  return m;
}

}  // namespace

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

int VoteTree::SubtreeEnd(int r, int size) {
  if (r == 0) return size;
  const int64_t end = static_cast<int64_t>(r) + (r & -r);
  return static_cast<int>(std::min<int64_t>(end, size));
}

std::vector<int> VoteTree::Children(int r, int size) {
  std::vector<int> out;
  const int end = SubtreeEnd(r, size);
  for (int64_t k = 1; r + k < end; k <<= 1) out.push_back(static_cast<int>(r + k));
  return out;
}

SteadySchedule::SteadySchedule(int rank, int size)
    : rank_(rank), size_(size), children_(VoteTree::Children(rank, size)) {}

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
  FindCurrent();
}

void SteadySchedule::Leave() {
  active_ = false;
  groups_.clear();
  ids_.clear();
  votes_.erase(votes_.begin(), votes_.lower_bound(Slot{epoch_ + 1, 0}));
  FindCurrent();
}

void SteadySchedule::FindCurrent() {
  auto it = votes_.find(Slot{epoch_, position_});
  current_ = it != votes_.end() ? &it->second : nullptr;
}

bool SteadySchedule::Find(const std::string& name, int32_t* cache_id, size_t* group) const {
  auto it = ids_.find(name);
  if (it == ids_.end()) return false;
  *cache_id = it->second.first;
  *group = it->second.second;
  return true;
}

SteadySchedule::Ballot& SteadySchedule::Tally(const Slot& at) {
  if (current_ != nullptr && at.first == epoch_ && at.second == position_)
    return *current_;  // (no map search)
  auto it = votes_.find(at);
  if (it == votes_.end()) {
    it = ballot_pool_.Insert(&votes_, [&](Slot& key) { key = at; });
    Ballot& b = it->second;  // a recycled ballot keeps its vectors' capacity
    const size_t n = children_.size();
    b.own = -1;
    if (b.own_vote.wire.capacity() > spare_wire_.capacity()) spare_wire_ = std::move(b.own_vote.wire);
    b.own_vote = Vote();
    b.child.assign(n, -1);
    b.child_inputs.resize(n);
    for (auto& in : b.child_inputs) in.clear();
    b.child_missing.resize(n);
    for (auto& m : b.child_missing) m.clear();
    b.child_stalled.assign(n, 0);
    b.aware = b.reported = b.stalled = b.woke = false;
    b.peer = -1;
    b.peer_input.clear();
    b.decision = -1;
    b.input_size = 0;
    b.decided.clear();
    if (at == Slot{epoch_, position_}) current_ = &b;
  }
  return it->second;
}

SteadySchedule::Ballot* SteadySchedule::Current() { return active_ ? current_ : nullptr; }

const SteadySchedule::Ballot* SteadySchedule::Current() const { return active_ ? current_ : nullptr; }

bool SteadySchedule::Over(const Slot& at) const {
  return at.first < epoch_ || (at.first == epoch_ && (!active_ || at.second < position_));
}

int SteadySchedule::ChildIndex(int peer) const {
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i] == peer) return static_cast<int>(i);
  }
  return -1;
}

void SteadySchedule::SendUp(const Slot& at, Ballot& b, VoteMessage::Type type, uint8_t outcome,
                            uint32_t input_size, const char* payload, size_t size) {
  const VoteMessage m = VoteHeader(type, at, outcome, input_size);
  outbox_.push_back({VoteTree::Parent(rank_), Serialize(m, payload, size)});
  if (type == VoteMessage::Type::kReport) b.reported = true;
}

// Rank 0, or a decision that reached this rank: keep it and pass it down.
void SteadySchedule::Decided(const Slot& at, Ballot& b, uint8_t outcome, uint32_t input_size,
                             std::string payload) {
  if (b.decision >= 0) return;
  b.decision = static_cast<int8_t>(outcome);
  b.input_size = input_size;
  b.decided.buf = std::move(payload);
  b.decided.off = 0;
  // Two ranks: rank 1 decides from rank 0's vote itself (PairDecide); only a failure goes down.
  if (children_.empty() || (size_ == 2 && outcome != VoteMessage::kFail)) return;
  const VoteMessage m = VoteHeader(VoteMessage::Type::kDecision, at, outcome, input_size);
  std::string wire = Serialize(m, b.decided.data(), b.decided.size());
  for (int c : children_) outbox_.push_back({c, wire});
}

// After any change to a ballot: report the subtree's outcome up (rank 0:
// decide) once it is known: exit at once, otherwise when the subtree is complete.
void SteadySchedule::Update(const Slot& at, Ballot& b) {
  if (b.decision >= 0 || b.reported) return;
  bool exit = b.own == VoteMessage::kExit, all = b.own >= 0;
  bool ready = b.own == VoteMessage::kReady, barrier = b.own == VoteMessage::kBarrier;
  for (int8_t c : b.child) {
    exit |= c == VoteMessage::kExit;
    all &= c >= 0;
    ready |= c == VoteMessage::kReady;
    barrier |= c == VoteMessage::kBarrier;
  }
  exit |= all && ready && barrier;  // the ranks are not at the same point
  if (!exit && !all) return;
  uint8_t outcome = exit ? VoteMessage::kExit : ready ? VoteMessage::kReady : VoteMessage::kBarrier;
  // Ready with inputs: the subtree's, in rank order (own, then each child's
  // consecutive subtree), when every rank carried one of the same length.
  uint32_t input_size = 0;
  std::string inputs;
  const Vote& own = b.own_vote;
  if (outcome == VoteMessage::kReady && own.input_size > 0) {
    const size_t each = own.input_size;
    bool whole = true;
    for (size_t i = 0; whole && i < children_.size(); ++i) {
      const int c = children_[i];
      whole = b.child_inputs[i].size() == each * static_cast<size_t>(VoteTree::SubtreeEnd(c, size_) - c);
    }
    if (whole) {
      input_size = static_cast<uint32_t>(each);
      if (!children_.empty() && size_ != 2) {  // (a leaf sends its own as packed; two ranks: VotedInputs)
        inputs.assign(own.input(), each);
        for (const Held& in : b.child_inputs) inputs.append(in.data(), in.size());
      }
    }
  }
  if (rank_ == 0) return Decided(at, b, outcome, input_size, std::move(inputs));
  if (input_size > 0 && children_.empty()) {
    SendOwn(at, b, VoteTree::Parent(rank_), outcome, input_size);
  } else {
    SendUp(at, b, VoteMessage::Type::kReport, outcome, input_size, inputs.data(), inputs.size());
  }
}

void SteadySchedule::SendOwn(const Slot& at, Ballot& b, int peer, uint8_t outcome, uint32_t input_size) {
  const VoteMessage m = VoteHeader(VoteMessage::Type::kReport, at, outcome, input_size);
  Vote& own = b.own_vote;
  if (own.input_offset + own.input_size == own.wire.size() && RewriteVoteHeader(m, &own.wire)) {
    Outgoing out{peer, std::string(), &own.wire};
    outbox_.push_back(std::move(out));
  } else {
    outbox_.push_back({peer, Serialize(m, own.input(), own.input_size)});
  }
  if (peer == VoteTree::Parent(rank_) && rank_ != 0) b.reported = true;
}

// Sends a stall notice up with the ranks missing now (never from rank 0, or
// once the subtree has reported: its report supersedes the notice).
void SteadySchedule::SendStalled(const Slot& at, Ballot& b) {
  if (rank_ == 0 || b.reported || b.decision >= 0) return;
  const std::vector<int> missing = MissingAt(b);
  std::string payload(missing.size() * 4, '\0');
  for (size_t i = 0; i < missing.size(); ++i) std::memcpy(&payload[i * 4], &missing[i], 4);
  SendUp(at, b, VoteMessage::Type::kStalled, 0, 0, payload.data(), payload.size());
}

// Two ranks: a decision down from rank 0 would make rank 1 wait for a second
// one-way trip; instead rank 0 sends rank 1 its own vote (VoteSelf), as rank 1
// sends its report up, and each decides from the two votes, alike.
void SteadySchedule::PairDecide(const Slot& at, Ballot& b) {
  if (b.decision >= 0) return;
  const int8_t mine = b.own, theirs = b.peer;
  if (mine == VoteMessage::kExit || theirs == VoteMessage::kExit)
    return Decided(at, b, VoteMessage::kExit, 0, "");
  if (mine < 0 || theirs < 0) return;
  if (mine != theirs) return Decided(at, b, VoteMessage::kExit, 0, "");  // ready against barrier
  const bool inputs = mine == VoteMessage::kReady && b.own_vote.input_size > 0 &&
                      b.peer_input.size() == b.own_vote.input_size;
  // (VotedInputs reads the two inputs where they are: no copy on the latency path)
  Decided(at, b, static_cast<uint8_t>(mine), inputs ? static_cast<uint32_t>(b.own_vote.input_size) : 0, "");
}

void SteadySchedule::Wake(const Slot& at, Ballot& b) {
  if (b.woke) return;
  b.woke = true;
  const VoteMessage m = VoteHeader(VoteMessage::Type::kWake, at, 0, 0);
  std::string wire;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (b.child[i] >= 0 || b.child_stalled[i]) continue;  // reported, or aware already
    if (wire.empty()) wire = Serialize(m);
    outbox_.push_back({children_[i], wire});
  }
}

std::vector<int> SteadySchedule::MissingAt(const Ballot& b) const {
  std::vector<int> missing;
  if (b.own < 0) missing.push_back(rank_);
  for (size_t i = 0; i < children_.size(); ++i) {
    if (b.child[i] >= 0) continue;
    if (b.child_stalled[i]) {
      missing.insert(missing.end(), b.child_missing[i].begin(), b.child_missing[i].end());
    } else {
      for (int r = children_[i]; r < VoteTree::SubtreeEnd(children_[i], size_); ++r) missing.push_back(r);
    }
  }
  return missing;
}

void SteadySchedule::OnMessage(int peer, VoteMessage& m, const std::string& wire) {
  const Slot at{m.epoch, m.position};
  const bool from_parent = rank_ != 0 && peer == VoteTree::Parent(rank_);
  const int child = ChildIndex(peer);
  if (m.type == VoteMessage::Type::kDecision && from_parent) {
    // Passed down on receipt, even when this rank is past it (it left by itself).
    for (int c : children_) outbox_.push_back({c, wire});
  }
  if (Over(at)) return;
  Ballot& b = Tally(at);
  switch (m.type) {
    case VoteMessage::Type::kDecision:
      if (!from_parent || b.decision >= 0) return;
      b.decision = static_cast<int8_t>(m.outcome);
      b.input_size = m.input_size;
      b.decided.Take(m);
      return;
    case VoteMessage::Type::kWake:
      if (!from_parent) return;
      b.aware = true;
      return Wake(at, b);
    case VoteMessage::Type::kReport:
      if (size_ == 2 && from_parent && b.peer < 0) {  // rank 0's own vote (two ranks)
        b.aware = true;
        b.peer = static_cast<int8_t>(m.outcome);
        if (m.outcome == VoteMessage::kReady && m.input_size > 0) b.peer_input.Take(m);
        return PairDecide(at, b);
      }
      if (child < 0 || b.child[child] >= 0) return;
      b.aware = true;
      b.child[child] = static_cast<int8_t>(m.outcome);
      if (m.outcome == VoteMessage::kReady && m.input_size > 0) b.child_inputs[child].Take(m);
      break;
    case VoteMessage::Type::kStalled:
      if (child < 0 || b.child[child] >= 0) return;
      b.aware = true;
      b.child_stalled[child] = 1;
      b.child_missing[child].resize(m.payload_size() / 4);
      if (m.payload_size() > 0)
        std::memcpy(b.child_missing[child].data(), m.payload_data(), b.child_missing[child].size() * 4);
      b.stalled = true;
      Wake(at, b);
      break;
  }
  Update(at, b);
  if (b.stalled) SendStalled(at, b);  // the missing ranks changed: tell the parent
}

void SteadySchedule::VoteSelf(bool ready) {
  Vote v;
  v.ready = ready;
  VoteSelf(std::move(v));
}

void SteadySchedule::VoteSelf(Vote own) {
  if (!active_) return;
  const Slot at{epoch_, position_};
  Ballot& b = Tally(at);
  if (b.own >= 0) return;
  b.own = own.ready ? VoteMessage::kReady : own.barrier ? VoteMessage::kBarrier : VoteMessage::kExit;
  if (own.ready && own.input_size > 0) b.own_vote = std::move(own);
  if (size_ == 2 && rank_ == 0)  // two ranks: rank 1 decides from this vote (PairDecide)
    SendOwn(at, b, 1, static_cast<uint8_t>(b.own), static_cast<uint32_t>(b.own_vote.input_size));
  Update(at, b);
  if (size_ == 2 && rank_ == 1) PairDecide(at, b);
  if (b.stalled) SendStalled(at, b);
}

bool SteadySchedule::VotedSelf() const {
  const Ballot* b = Current();
  return b != nullptr && b->own >= 0;
}

bool SteadySchedule::Aware() const {
  const Ballot* b = Current();
  return b != nullptr && (b->own >= 0 || b->aware || b->decision >= 0);
}

bool SteadySchedule::SubtreeComplete() const {
  const Ballot* b = Current();
  if (b == nullptr || b->own < 0) return false;
  for (int8_t c : b->child) {
    if (c < 0) return false;
  }
  return true;
}

void SteadySchedule::Stall() {
  Ballot* b = Current();
  if (b == nullptr || b->stalled || b->reported || b->decision >= 0) return;
  const Slot at{epoch_, position_};
  b->stalled = true;
  Wake(at, *b);
  SendStalled(at, *b);
}

std::vector<int> SteadySchedule::Missing() const {
  const Ballot* b = Current();
  if (b == nullptr) {
    std::vector<int> all;
    for (int r = rank_; r < VoteTree::SubtreeEnd(rank_, size_); ++r) all.push_back(r);
    return all;
  }
  return MissingAt(*b);
}

void SteadySchedule::Fail(const std::string& why) {
  if (!active_ || rank_ != 0) return;
  const Slot at{epoch_, position_};
  Decided(at, Tally(at), VoteMessage::kFail, 0, why);
}

void SteadySchedule::PeerDeparted(int peer) {
  if (!active_) return;
  const Slot at{epoch_, position_};
  Ballot& b = Tally(at);
  if (b.decision >= 0) return;
  if (rank_ != 0 && peer == VoteTree::Parent(rank_)) return Decided(at, b, VoteMessage::kExit, 0, "");
  const int child = ChildIndex(peer);
  if (child < 0 || b.child[child] >= 0) return;
  b.child[child] = VoteMessage::kExit;
  Update(at, b);
}

SteadySchedule::Outcome SteadySchedule::Decide() const {
  const Ballot* b = Current();
  if (b == nullptr) return Outcome::kWait;
  switch (b->decision) {
    case VoteMessage::kReady:
      return Outcome::kRun;
    case VoteMessage::kBarrier:
      return Outcome::kBarrier;
    case VoteMessage::kExit:
      return Outcome::kExit;
    case VoteMessage::kFail:
      return Outcome::kFail;
    default:
      return Outcome::kWait;
  }
}

std::string SteadySchedule::failure() const {
  const Ballot* b = Current();
  if (b == nullptr || b->decision != VoteMessage::kFail) return std::string();
  return std::string(b->decided.data(), b->decided.size());
}

bool SteadySchedule::VotedInputs(std::vector<const char*>* parts) const {
  if (Decide() != Outcome::kRun) return false;
  const Ballot& b = *Current();
  if (b.input_size == 0) return false;
  parts->clear();
  if (size_ == 2 && b.decided.size() == 0) {  // two ranks decide from the two votes' own buffers
    const Held& peer = rank_ == 0 ? b.child_inputs[0] : b.peer_input;
    if (peer.size() != b.input_size || b.own_vote.input_size != b.input_size) return false;
    parts->push_back(rank_ == 0 ? b.own_vote.input() : peer.data());
    parts->push_back(rank_ == 0 ? peer.data() : b.own_vote.input());
    return true;
  }
  if (b.decided.size() != static_cast<size_t>(size_) * b.input_size) return false;
  for (int r = 0; r < size_; ++r) parts->push_back(b.decided.data() + static_cast<size_t>(r) * b.input_size);
  return true;
}

void SteadySchedule::Advance() {
  const bool ran_group = Decide() != Outcome::kBarrier;
  auto it = votes_.find(Slot{epoch_, position_});
  if (it != votes_.end()) ballot_pool_.Erase(&votes_, it);
  ++position_;
  if (ran_group) ++groups_run_;
  FindCurrent();
}

void SteadySchedule::TakeOutgoing(std::vector<Outgoing>* out) {
  out->clear();
  out->swap(outbox_);
}

}  // namespace hvdlite
