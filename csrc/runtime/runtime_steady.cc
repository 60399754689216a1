// Steady state on a rank (the protocol: coordinator/steady_state.h): schedule
// mode holds this rank's submissions instead of sending them to rank 0, votes
// ready/exit per position to every other rank, runs a position's group once
// every rank voted ready, and falls back to negotiation on any exit vote.
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
#include "runtime/runtime.h"

namespace hvdlite {

// How long a rank that holds part of the current group, or has seen a peer's
// vote, waits for its caller before voting exit: long enough for callers that
// submit a step's tensors in different orders, short against the stall check
// (so a diverged job reaches the coordinator's stall warning well in time).
double Runtime::SchedulePatienceSeconds() const {
  return std::max(0.01, std::min(1.0, cfg_.STALL_CHECK_TIME_SECONDS / 4));
}

// Schedule mode: takes new submissions without sending them; notes whether
// any of them is something the schedule does not expect (then this rank
// votes exit at its current position). A changed report of blocked callers is
// held too (sent on leaving), so the queue counts it as reported and the
// engine does not wake for it again and again.
void Runtime::HoldNewRequests() {
  if (cfg_.DEADLOCK_CHECK_DISABLE) {
    queue_.TakeNew(&taken_);
  } else {
    RankWaits waits;
    bool changed = false;
    queue_.TakeNew(&taken_, &waits, &changed);
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
      unexpected_held_ |= local_cache_.CachedId(r) != id;  // a changed signature: the coordinator must see it
    }
    held_.push_back(std::move(r));
  }
  taken_.clear();  // (moved-from requests) empty for the next TakeNew, capacity kept
}

// The oldest held barrier of the global set, or null.
const Request* Runtime::HeldBarrier() const {
  for (const Request& r : held_) {
    if (r.type == OpType::kBarrier && r.process_set == 0) return &r;
  }
  return nullptr;
}

// Decides this rank's vote at the current position, if it can yet: true with
// v->ready or v->barrier set (neither: exit), or false (no vote yet).
bool Runtime::ChooseVote(Vote* v) {
  v->ready = v->barrier = false;
  if (unexpected_held_ || shutdown_requested_.load()) return true;
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
  if (held_.empty() && !steady_.AnyVote()) {
    patience_started_ = false;
    return false;
  }
  // Part of the group (or of later ones) is here but the caller is blocked:
  // it will not submit the rest (a changed order, a skipped tensor). Unless
  // it submitted more since this turn took the queue's new requests: a caller
  // submits before it blocks, so those are visible once its wait is (next turn).
  if (!held_.empty() && queue_.CallerBlocked() && !queue_.HasNew()) return true;
  const Clock::time_point now = Clock::now();
  if (!patience_started_) {
    patience_started_ = true;
    patience_since_ = now;
  }
  return std::chrono::duration<double>(now - patience_since_).count() >= SchedulePatienceSeconds();
}

// A ready vote carries this rank's input when the group allows it
// (Executor::VotedInput; coordinator/steady_state.h).
Status Runtime::SendVote(Vote v) {
  v.epoch = steady_.epoch();
  v.position = steady_.position();
  if (!v.ready || !executor_->VotedInput(steady_.group(), &v)) SerializeWithRoom(&v, 0);
  voted_at_ = last_vote_warning_ = Clock::now();
  for (int peer = 0; peer < topo_.size; ++peer) {
    if (peer == topo_.rank || transport_->PeerDeparted(peer)) continue;
    HVD_RETURN_IF_ERROR(transport_->SendControl(peer, v.wire));
  }
  voted_barrier_ = v.barrier;
  steady_.VoteSelf(std::move(v));
  return Status::OK();
}

// A peer that departed without voting at the current position never will:
// it counts as exit. Its vote, if it sent one, was sent before its departure
// notice; the control plane is drained once more first so it is not missed.
Status Runtime::CountDepartedAsExit() {
  for (int peer = 0; peer < topo_.size; ++peer) {
    if (peer == topo_.rank || steady_.Voted(peer) || !transport_->PeerDeparted(peer)) continue;
    HVD_RETURN_IF_ERROR(transport_->WaitControl(-1, 0, &incoming_));
    HVD_RETURN_IF_ERROR(HandleIncoming());
    if (!steady_.active()) return Status::OK();
    if (steady_.Voted(peer)) continue;
    Vote v;
    v.epoch = steady_.epoch();
    v.position = steady_.position();
    steady_.OnVote(peer, v);
  }
  return Status::OK();
}

// This rank voted and waits for the others. A live peer votes within its
// patience of seeing a vote (ChooseVote), so a vote missing much longer means
// a hung process: warn as the stall inspector would, and after
// HVDLITE_TIMEOUT_SECONDS (plus the patience) fail as a hung transfer does.
Status Runtime::CheckVoteWait() {
  if (!steady_.Voted(topo_.rank)) return Status::OK();
  const Clock::time_point now = Clock::now();
  const double waited = std::chrono::duration<double>(now - voted_at_).count();
  const bool fail = waited >= cfg_.TIMEOUT_SECONDS + SchedulePatienceSeconds();
  const bool warn =
      !cfg_.STALL_CHECK_DISABLE &&
      std::chrono::duration<double>(now - last_vote_warning_).count() >= cfg_.STALL_CHECK_TIME_SECONDS;
  if (!fail && !warn) return Status::OK();
  std::string missing;
  for (int r = 0; r < topo_.size; ++r) {
    if (!steady_.Voted(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  const Response& g = steady_.group();
  std::ostringstream os;
  os << "ranks " << missing << " sent no steady-state vote for " << static_cast<int>(waited)
     << " s while rank " << topo_.rank;
  if (voted_barrier_ && HeldBarrier() != nullptr) {
    os << " waits in barrier '" << HeldBarrier()->name << "'";
  } else {
    os << " waits to run tensor '" << g.names[0] << "'";
    if (g.names.size() > 1) os << " (and " << g.names.size() - 1 << " more)";
  }
  if (fail) {
    return Status::Timeout(os.str() +
                           ": their hvdlite engine does not run (a stopped or hung process). "
                           "Raise HVDLITE_TIMEOUT_SECONDS if it is only slow");
  }
  last_vote_warning_ = now;
  HVD_LOG(kWarning, os.str() << "; a live rank votes within a second, so it may be stopped or hung.");
  return Status::OK();
}

// Votes when it can, then runs every position all ranks voted ready for, or
// leaves schedule mode at the first one some rank voted exit for.
Status Runtime::RunSchedule() {
  while (steady_.active()) {
    Vote vote;
    if (!steady_.Voted(topo_.rank) && ChooseVote(&vote)) HVD_RETURN_IF_ERROR(SendVote(std::move(vote)));
    HVD_RETURN_IF_ERROR(CountDepartedAsExit());
    switch (steady_.Decide()) {
      case SteadySchedule::Outcome::kWait:
        return CheckVoteWait();
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

Status Runtime::RunScheduledGroup() {
  const Response& group = steady_.group();
  const size_t index = steady_.group_index();
  held_.erase(std::remove_if(held_.begin(), held_.end(),
                             [&](const Request& r) {
                               int32_t id = -1;
                               size_t g = 0;
                               return steady_.Find(r.name, &id, &g) && g == index;
                             }),
              held_.end());
  if (timeline_.Active()) {
    for (const std::string& name : group.names) timeline_.End(name, "QUEUE");
  }
  const bool voted_inputs = steady_.VotedInputs(&voted_inputs_);
  Status st = executor_->ExecuteScheduled(group, voted_inputs ? &voted_inputs_ : nullptr);
  steady_.Advance();
  patience_started_ = false;
  return st;
}

// Every rank voted barrier: each completes its oldest held barrier (there is
// nothing to exchange: every rank has reached it).
Status Runtime::RunScheduledBarrier() {
  const Request* held = HeldBarrier();
  if (held == nullptr)
    return Status::Internal("steady state: every rank voted barrier, but this rank holds none");
  Response barrier;
  barrier.type = OpType::kBarrier;
  barrier.names = {held->name};
  held_.erase(held_.begin() + (held - held_.data()));
  if (timeline_.Active()) timeline_.End(barrier.names[0], "QUEUE");
  Status st = executor_->ExecuteScheduled(barrier);
  steady_.Advance();
  patience_started_ = false;
  return st;
}

// Every rank leaves at the same position; each sends the coordinator what it
// holds (in submission order), and the coordinator, on rank 0, learns anew.
Status Runtime::LeaveSchedule() {
  HVD_LOG(kDebug,
          "steady state: leaving schedule " << steady_.epoch() << " at position " << steady_.position());
  steady_.Leave();
  patience_started_ = false;
  unexpected_held_ = false;
  if (coordinator_) coordinator_->EndSchedule();
  return SendNewRequests();
}

// End of a turn, once the responses announced with a schedule have run.
Status Runtime::EnterAnnouncedSchedule() {
  if (announced_.empty() || steady_.active()) return Status::OK();
  steady_.Enter(announced_epoch_, std::move(announced_));
  announced_.clear();
  patience_started_ = false;
  unexpected_held_ = false;
  HVD_LOG(kDebug, "steady state: entering schedule " << steady_.epoch() << " of "
                                                     << steady_.group().names.size() << "+ tensors");
  // Requests of this rank are at the coordinator, undecided: hand them over
  // by falling back at once (coordinator/steady_state.h).
  if (queue_.TakenWaiting() > 0) return SendVote(Vote{});
  return Status::OK();
}

// Milliseconds until this rank's patience runs out, or (once it voted) its
// next check of a missing vote (CheckVoteWait).
int Runtime::ScheduleBudgetMs() const {
  if (!steady_.active()) return 1000;
  auto after = [](Clock::time_point from, double seconds) {
    return from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  Clock::time_point due;
  if (steady_.Voted(topo_.rank)) {
    due = after(voted_at_, cfg_.TIMEOUT_SECONDS + SchedulePatienceSeconds());
    if (!cfg_.STALL_CHECK_DISABLE)
      due = std::min(due, after(last_vote_warning_, cfg_.STALL_CHECK_TIME_SECONDS));
  } else if (patience_started_) {
    due = after(patience_since_, SchedulePatienceSeconds());
  } else {
    return 1000;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - Clock::now()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(left + 1, 1000)));
}

}  // namespace hvdlite
