// SteadyStateDriver (steady_driver.h; the protocol: coordinator/steady_state.h).
//
// Every function here runs on the engine holder (engine_mu_) and never blocks:
// waiting for votes is the engine's ordinary wait for control messages
// (WaitForWork), bounded by the patience below (WaitBudgetMs).
// Bounded waits: a rank that voted waits for the others' votes; each of them
// votes within its patience once it holds part of the group or sees a vote
// (or at once, on anything unexpected or a shutdown), a departed peer counts
// as exit, and a dead one fails the transport as always. So no wait here
// lasts longer than the patience plus a message; what follows a fallback
// (stall warnings, stall timeouts, mismatch errors) is the coordinator's, as
// without a schedule.
#include <algorithm>
#include <sstream>

#include "common/logging.h"
#include "runtime/steady_driver.h"

namespace hvdlite {

SteadyStateDriver::SteadyStateDriver(const Parts& parts)
    : p_(parts), steady_(parts.topo->rank, parts.topo->size) {}

void SteadyStateDriver::TakeHeld(std::vector<Request>* fresh, RankWaits* waits, bool* has_waits) {
  if (held_has_waits_ && !*has_waits) {  // reported while in schedule mode (and not changed since)
    *waits = std::move(held_waits_);
    *has_waits = true;
  }
  held_has_waits_ = false;
  if (!held_.empty()) {  // held in schedule mode, which this rank just left: they go first
    fresh->insert(fresh->begin(), std::make_move_iterator(held_.begin()),
                  std::make_move_iterator(held_.end()));
    held_.clear();
  }
}

Status SteadyStateDriver::OnVoteMessage(int peer, std::string&& payload) {
  VoteMessage m;
  HVD_RETURN_IF_ERROR(Deserialize(std::move(payload), &m).WithContext("from rank " + std::to_string(peer)));
  steady_.OnMessage(peer, m);
  return Flush();  // a decision goes on down at once
}

// Sends what the vote tree has for this rank's parent and children. A peer
// that departed gets nothing (CountDeparted accounts for it).
Status SteadyStateDriver::Flush() {
  steady_.TakeOutgoing(&outgoing_);
  for (const SteadySchedule::Outgoing& out : outgoing_) {
    if (p_.transport->PeerDeparted(out.peer)) continue;
    HVD_RETURN_IF_ERROR(p_.transport->SendControl(out.peer, out.bytes()));
  }
  outgoing_.clear();
  return Status::OK();
}

void SteadyStateDriver::Announce(int64_t epoch, std::vector<Response> schedule) {
  if (schedule.empty()) return;
  announced_epoch_ = epoch;
  announced_ = std::move(schedule);
}

// How long a rank that holds part of the current group, or has seen a peer's
// vote, waits for its caller before voting exit: long enough for callers that
// submit a step's tensors in different orders, short against the stall check
// (so a diverged job reaches the coordinator's stall warning well in time).
double SteadyStateDriver::PatienceSeconds() const {
  return std::max(0.01, std::min(1.0, p_.cfg->STALL_CHECK_TIME_SECONDS / 4));
}

// Schedule mode: takes new submissions without sending them; notes whether
// any of them is something the schedule does not expect (then this rank
// votes exit at its current position). A changed report of blocked callers is
// held too (sent on leaving), so the queue counts it as reported and the
// engine does not wake for it again and again.
void SteadyStateDriver::HoldNewRequests() {
  if (p_.cfg->DEADLOCK_CHECK_DISABLE) {
    p_.queue->TakeNew(&taken_);
  } else {
    RankWaits waits;
    bool changed = false;
    p_.queue->TakeNew(&taken_, &waits, &changed);
    if (changed) {
      held_waits_ = std::move(waits);
      held_has_waits_ = true;
    }
  }
  for (auto& r : taken_) {
    int32_t id = -1;
    size_t group = 0;
    if (r.type == OpType::kBarrier && r.process_set == 0) {
      // a barrier of the global set: voted on as such (steady_state.h)
    } else if (r.type == OpType::kShutdown || r.process_set != 0 || !steady_.Find(r.name, &id, &group)) {
      unexpected_held_ = true;
    } else {
      unexpected_held_ |= p_.cache->CachedId(r) != id;  // a changed signature: the coordinator must see it
    }
    held_.push_back(std::move(r));
  }
  taken_.clear();  // (moved-from requests) empty for the next TakeNew, capacity kept
}

// The oldest held barrier of the global set, or null.
const Request* SteadyStateDriver::HeldBarrier() const {
  for (const Request& r : held_) {
    if (r.type == OpType::kBarrier && r.process_set == 0) return &r;
  }
  return nullptr;
}

// Decides this rank's vote at the current position, if it can yet: true with
// v->ready or v->barrier set (neither: exit), or false (no vote yet).
bool SteadyStateDriver::ChooseVote(Vote* v) {
  v->ready = v->barrier = false;
  if (unexpected_held_ || p_.host->ShuttingDown()) return true;
  const size_t want = steady_.group_index();
  size_t in_group = 0;
  for (const Request& r : held_) {
    int32_t id = -1;
    size_t group = 0;
    if (steady_.Find(r.name, &id, &group) && group == want) ++in_group;
  }
  if (in_group == steady_.group().names.size()) {
    v->ready = true;
    return true;
  }
  if (in_group == 0 && HeldBarrier() != nullptr) {
    v->barrier = true;
    return true;
  }
  if (held_.empty() && !steady_.Aware()) {
    patience_started_ = false;
    return false;
  }
  // Part of the group (or of later ones) is here but the caller is blocked:
  // it will not submit the rest (a changed order, a skipped tensor). Unless
  // it submitted more since this turn took the queue's new requests: a caller
  // submits before it blocks, so those are visible once its wait is (next turn).
  if (!held_.empty() && p_.queue->CallerBlocked() && !p_.queue->HasNew()) return true;
  const Clock::time_point now = Clock::now();
  if (!patience_started_) {
    patience_started_ = true;
    patience_since_ = now;
  }
  return std::chrono::duration<double>(now - patience_since_).count() >= PatienceSeconds();
}

// A ready vote carries this rank's input when the group allows it
// (Executor::VotedInput; coordinator/steady_state.h).
Status SteadyStateDriver::SendVote(Vote v) {
  v.epoch = steady_.epoch();
  v.position = steady_.position();
  v.wire = steady_.TakeSpareWire();  // (packing reuses its capacity)
  if (!v.ready || !p_.executor->VotedInput(steady_.group(), &v)) SerializeWithRoom(&v, 0);
  voted_at_ = last_vote_warning_ = Clock::now();
  voted_barrier_ = v.barrier;
  steady_.VoteSelf(std::move(v));
  return Flush();
}

// A child that departed without reporting at the current position never
// will: its subtree counts as exit; a departed parent's decision never comes
// (SteadySchedule::PeerDeparted). What it sent before its departure notice is
// taken in first, so it is not missed.
Status SteadyStateDriver::CountDeparted() {
  if (p_.transport->departures() == 0) return Status::OK();  // (every turn: no peer lookups)
  const int parent = steady_.parent();
  auto departed = [&](int peer) { return peer >= 0 && p_.transport->PeerDeparted(peer); };
  bool any = departed(parent);
  for (int c : steady_.children()) any |= departed(c);
  if (!any) return Status::OK();
  HVD_RETURN_IF_ERROR(p_.host->DrainControl());
  if (!steady_.active()) return Status::OK();
  if (departed(parent)) steady_.PeerDeparted(parent);
  for (int c : steady_.children()) {
    if (departed(c)) steady_.PeerDeparted(c);
  }
  return Flush();
}

// Once this rank knew of a vote at its position, its subtree has the stall
// delay (the patience) to complete; then the vote tree reports the stall up
// and wakes the idle ranks below (coordinator/steady_state.h).
Status SteadyStateDriver::CheckStall(LazyNow* clock) {
  if (!steady_.Aware() || steady_.SubtreeComplete()) return Status::OK();
  const Clock::time_point now = clock->Get();
  if (!aware_started_) {
    aware_started_ = true;
    aware_since_ = now;
  }
  if (std::chrono::duration<double>(now - aware_since_).count() < PatienceSeconds()) return Status::OK();
  steady_.Stall();
  return Flush();
}

// How long this rank waits, after its vote, for the decision before it
// fails: rank 0 fails first and tells every rank (kFail); the others allow
// for rank 0 voting up to a stall delay and a patience after them.
double SteadyStateDriver::FailAfterSeconds() const {
  return p_.cfg->TIMEOUT_SECONDS + PatienceSeconds() * (p_.topo->rank == 0 ? 1 : 3) +
         (p_.topo->rank == 0 ? 0.0 : 1.0);
}

// This rank voted and waits for the others. A live peer votes within its
// patience of seeing a vote (ChooseVote), so a vote missing much longer means
// a hung process: warn as the stall inspector would, and after
// HVDLITE_TIMEOUT_SECONDS (plus the patience) fail as a hung transfer does.
Status SteadyStateDriver::CheckVoteWait(LazyNow* clock) {
  if (!steady_.VotedSelf()) return Status::OK();
  const Clock::time_point now = clock->Get();
  const double waited = std::chrono::duration<double>(now - voted_at_).count();
  const bool fail = waited >= FailAfterSeconds();
  const bool warn =
      !p_.cfg->STALL_CHECK_DISABLE &&
      std::chrono::duration<double>(now - last_vote_warning_).count() >= p_.cfg->STALL_CHECK_TIME_SECONDS;
  if (!fail && !warn) return Status::OK();
  const std::vector<int> missing = steady_.Missing();
  std::ostringstream os;
  if (missing.empty()) {
    os << "rank 0 sent no steady-state decision";
  } else {
    os << "ranks ";
    for (size_t i = 0; i < missing.size() && i < kNamedRanks; ++i) os << (i ? ", " : "") << missing[i];
    if (missing.size() > kNamedRanks) os << " (and " << missing.size() - kNamedRanks << " more)";
    os << " sent no steady-state vote";
  }
  const Response& g = steady_.group();
  os << " for " << static_cast<int>(waited) << " s while rank " << p_.topo->rank;
  if (voted_barrier_ && HeldBarrier() != nullptr) {
    os << " waits in barrier '" << HeldBarrier()->name << "'";
  } else {
    os << " waits to run tensor '" << g.names[0] << "'";
    if (g.names.size() > 1) os << " (and " << g.names.size() - 1 << " more)";
  }
  if (fail) {
    const std::string why = os.str() +
                            ": their hvdlite engine does not run (a stopped or hung process). "
                            "Raise HVDLITE_TIMEOUT_SECONDS if it is only slow";
    steady_.Fail(why);  // rank 0: every rank fails with this message
    HVD_RETURN_IF_ERROR(Flush());
    return Status::Timeout(why);
  }
  last_vote_warning_ = now;
  HVD_LOG(kWarning, os.str() << "; a live rank votes within a second, so it may be stopped or hung.");
  return Status::OK();
}

// Votes when it can, then runs every position all ranks voted ready for, or
// leaves schedule mode at the first one some rank voted exit for.
Status SteadyStateDriver::Run() {
  while (steady_.active()) {
    Vote vote;
    if (!steady_.VotedSelf() && ChooseVote(&vote)) HVD_RETURN_IF_ERROR(SendVote(std::move(vote)));
    HVD_RETURN_IF_ERROR(CountDeparted());
    LazyNow clock;  // the two checks below share one clock read, and a decided position takes none
    HVD_RETURN_IF_ERROR(CheckStall(&clock));
    switch (steady_.Decide()) {
      case SteadySchedule::Outcome::kWait:
        return CheckVoteWait(&clock);
      case SteadySchedule::Outcome::kFail:
        return Status::Timeout(steady_.failure());
      case SteadySchedule::Outcome::kExit:
        return LeaveSchedule();
      case SteadySchedule::Outcome::kRun:
        HVD_RETURN_IF_ERROR(RunScheduledGroup());
        break;
      case SteadySchedule::Outcome::kBarrier:
        HVD_RETURN_IF_ERROR(RunScheduledBarrier());
        break;
    }
  }
  return Status::OK();
}

Status SteadyStateDriver::RunScheduledGroup() {
  const Response& group = steady_.group();
  const size_t index = steady_.group_index();
  held_.erase(std::remove_if(held_.begin(), held_.end(),
                             [&](const Request& r) {
                               int32_t id = -1;
                               size_t g = 0;
                               return steady_.Find(r.name, &id, &g) && g == index;
                             }),
              held_.end());
  if (p_.timeline->Active()) {
    for (const std::string& name : group.names) p_.timeline->End(name, "QUEUE");
  }
  const bool voted_inputs = steady_.VotedInputs(&voted_inputs_);
  Status st = p_.executor->ExecuteScheduled(group, voted_inputs ? &voted_inputs_ : nullptr);
  steady_.Advance();
  patience_started_ = aware_started_ = false;
  return st;
}

// Every rank voted barrier: each completes its oldest held barrier (there is
// nothing to exchange: every rank has reached it).
Status SteadyStateDriver::RunScheduledBarrier() {
  const Request* held = HeldBarrier();
  if (held == nullptr)
    return Status::Internal("steady state: every rank voted barrier, but this rank holds none");
  Response barrier;
  barrier.type = OpType::kBarrier;
  barrier.names = {held->name};
  held_.erase(held_.begin() + (held - held_.data()));
  if (p_.timeline->Active()) p_.timeline->End(barrier.names[0], "QUEUE");
  Status st = p_.executor->ExecuteScheduled(barrier);
  steady_.Advance();
  patience_started_ = aware_started_ = false;
  return st;
}

// Every rank leaves at the same position; each sends the coordinator what it
// holds (in submission order), and the coordinator, on rank 0, learns anew.
Status SteadyStateDriver::LeaveSchedule() {
  HVD_LOG(kDebug,
          "steady state: leaving schedule " << steady_.epoch() << " at position " << steady_.position());
  steady_.Leave();
  patience_started_ = aware_started_ = false;
  unexpected_held_ = false;
  p_.host->ScheduleEnded();
  return p_.host->SendNewRequests();
}

// End of a turn, once the responses announced with a schedule have run.
Status SteadyStateDriver::EnterAnnounced() {
  if (announced_.empty() || steady_.active()) return Status::OK();
  steady_.Enter(announced_epoch_, std::move(announced_));
  announced_.clear();
  patience_started_ = aware_started_ = false;
  unexpected_held_ = false;
  HVD_LOG(kDebug, "steady state: entering schedule " << steady_.epoch() << " of "
                                                     << steady_.group().names.size() << "+ tensors");
  // Requests of this rank are at the coordinator, undecided: hand them over
  // by falling back at once (coordinator/steady_state.h).
  if (p_.queue->TakenWaiting() > 0) return SendVote(Vote{});
  return Status::OK();
}

// Milliseconds until this rank's patience runs out, or (once it voted) its
// next check of a missing vote (CheckVoteWait).
int SteadyStateDriver::BudgetMs() const {
  if (!steady_.active()) return 1000;
  auto after = [](Clock::time_point from, double seconds) {
    return from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  Clock::time_point due;
  due = Clock::time_point::max();
  if (steady_.VotedSelf()) {
    due = after(voted_at_, FailAfterSeconds());
    if (!p_.cfg->STALL_CHECK_DISABLE)
      due = std::min(due, after(last_vote_warning_, p_.cfg->STALL_CHECK_TIME_SECONDS));
  } else if (patience_started_) {
    due = after(patience_since_, PatienceSeconds());
  }
  if (aware_started_ && !steady_.SubtreeComplete())
    due = std::min(due, after(aware_since_, PatienceSeconds()));
  if (due == Clock::time_point::max()) return 1000;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - Clock::now()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(left + 1, 1000)));
}

}  // namespace hvdlite
