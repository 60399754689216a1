// Steady state: a training loop submits the same named tensors in the same
// order every step. Once the coordinator has seen that, the ranks run those
// tensors without asking it ("learned schedule + ready/exit consensus"):
//
//  1. Learning (ScheduleLearner, on the coordinator): the responses it
//     decides, after fusion, in the one global order. When the ones decided
//     since the last reset end with the same period twice (same responses:
//     names, fusion groups, cache ids; every one an error-free, cached
//     collective of the global set, each name once per period), and nothing
//     is undecided at the coordinator, it announces that period as a schedule
//     (ResponseList::schedule, numbered by an epoch) at the end of a Drain:
//     every rank receives it after the same responses, so every rank's
//     position 0 is the same point of the global order.
//  2. Schedule mode (SteadySchedule, on every rank): a rank sends no requests.
//     At position p (group p mod |S|) it votes once, to every other rank:
//     ready(p) when its caller has submitted every tensor of the group with a
//     request identical to the cached one, exit(p) as soon as it holds
//     anything the schedule does not expect (a new name, a changed signature,
//     join, a process-set op, shutdown...), or when its wait at p
//     ran out of patience (it holds part of the group but its caller is
//     blocked, or waited too long; or peers voted and it did not).
//     Position p runs, on every rank, iff every rank voted ready(p): the group
//     is executed as the coordinator decided it before. Any exit(p) makes
//     every rank leave schedule mode at p: each sends the requests it held to
//     the coordinator, which negotiates them as always (so mismatches fail
//     with exactly today's errors, stalls warn as today), and learns afresh.
//  Because each rank casts exactly one vote per position and ranks advance
//  only on a unanimous vote, every rank takes the same decision at every
//  position; a rank is at most one position ahead of another.
//  Barriers: a rank whose caller waits in a barrier of the global set, and
//  that holds nothing of the current group, votes barrier(p) instead. When
//  every rank voted barrier(p), the barrier completes on every rank (every
//  rank has reached it: that is all a barrier promises) and the next position
//  p + 1 takes the same group; any other mix of votes is an exit. So a loop
//  that calls barrier() between its steps (a benchmark's repetitions) stays
//  in schedule mode. position() counts the decisions (groups run and
//  barriers), group_index() only the groups run.
//  Hand-over: a rank that has requests at the coordinator when the schedule
//  arrives (sent before it, undecided) votes exit(0), so a schedule runs only
//  when nothing was in flight to the coordinator from any rank.
//  Epochs: votes carry the schedule's epoch, so a late vote of a schedule
//  that is over is dropped, and one of a schedule a rank has not received yet
//  is kept for it.
//  Bounded waits (runtime/steady_driver.cc): a live rank's engine votes within its
//  patience (at most 1 s) of seeing a peer's vote, so a rank that voted ready
//  waits at most that long for a live peer; it warns as the stall inspector
//  does after HVDLITE_STALL_CHECK_TIME_SECONDS and fails, as a hung transfer
//  does, after HVDLITE_TIMEOUT_SECONDS. A departed peer counts as exit.
//  Votes that carry the data: a ready vote for a group that is one small CPU
//  allreduce (below the size where Allreduce switches from recursive doubling
//  to the ring, on a backend that would run recursive doubling for it) carries
//  the voter's packed, prescaled input (Executor::VotedInput). Once every
//  rank voted ready with its input, every rank holds every input and reduces
//  them itself, along recursive doubling's tree (the same bits as running it),
//  so the group costs one message per peer instead of a vote and then the
//  collective's rounds. Whether a position runs this way depends only on the
//  votes, which every rank sees alike: a rank whose vote carries no input
//  (another backend, a larger group) makes every rank run the collective. An
//  exit vote discards the inputs with the votes; nothing reached the data plane.
//  Why replay whole fused responses rather than agree per cache hit: the
//  schedule fixes the fusion groups and their order too, so every rank runs
//  the same collectives in the same order with one vote per group, without
//  anyone deciding anything. Cost: votes go all-to-all, (n-1) small messages
//  per rank and group (rank 0 handles 2(n-1) per tensor group today).
//
// Pure logic: no I/O, no clock (the runtime moves the votes and keeps time),
// so tests drive it without sockets (tests/cpp/test_steady_state.cc).
// Threading: single-threaded (the engine holder).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/node_pool.h"
#include "coordinator/messages.h"

namespace hvdlite {

// Coordinator side: finds the period of the decided responses.
class ScheduleLearner {
 public:
  // Longest period (in fused responses) it looks for.
  explicit ScheduleLearner(size_t max_period = 512) : max_period_(max_period) {}
  // One decided (fused) response in the global order; `global`: it went to
  // every rank. A response a schedule cannot replay starts learning afresh,
  // except a barrier of the global set, which is skipped.
  void Observe(const Response& r, bool global);
  void Reset();
  // True when the responses observed since the last reset end with one period
  // repeated twice; *period = that period, oldest first. O(period).
  bool Period(std::vector<Response>* period) const;

 private:
  static bool Replayable(const Response& r);
  size_t max_period_;
  std::deque<Response> history_;  // at most 2 * max_period_
  std::deque<std::string> keys_;  // history_'s serialized form, for comparison
};

// Rank side: where this rank stands in the announced schedule, and the votes.
class SteadySchedule {
 public:
  explicit SteadySchedule(int rank = 0, int size = 1) : rank_(rank), size_(size) {}
  // Starts schedule mode at position 0 of `groups`, numbered `epoch` (> every earlier one).
  void Enter(int64_t epoch, std::vector<Response> groups);
  void Leave();
  bool active() const { return active_; }
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }
  // The group to run next (position() may be a barrier's instead).
  const Response& group() const { return groups_[group_index()]; }
  // The cache id the schedule expects `name` (global set) under, and the index
  // of its group; false when the schedule does not contain it.
  bool Find(const std::string& name, int32_t* cache_id, size_t* group) const;
  size_t group_index() const { return static_cast<size_t>(groups_run_ % groups_.size()); }
  // Takes a peer's vote. Votes of epochs that are over are dropped; votes of
  // an epoch not entered yet are kept for it. A second vote of a rank for one
  // position is ignored.
  void OnVote(int peer, Vote v);
  // This rank's vote at position() (the runtime sends it to every peer): ready
  // or exit; or `own` (ready, barrier or exit), keeping the input it carries.
  void VoteSelf(bool ready);
  void VoteSelf(Vote own);
  bool Voted(int rank) const;  // `rank` has voted at position()
  bool AnyVote() const;        // some rank has voted at position()
  enum class Outcome { kWait, kRun, kBarrier, kExit };
  // kRun: every rank voted ready(position()); kBarrier: every rank voted
  // barrier; kExit: some rank voted exit, or every rank voted and they differ;
  // kWait: not every rank has voted yet.
  Outcome Decide() const;
  // When Decide() is kRun and every rank's ready vote carried an input of one
  // length: true, with parts[r] = rank r's input (valid until Advance()).
  bool VotedInputs(std::vector<const char*>* parts) const;
  // After running position(): on to the next one (and, when it ran the
  // group rather than a barrier, to the next group).
  void Advance();

 private:
  using Slot = std::pair<int64_t, int64_t>;  // (epoch, position)
  static constexpr int8_t kExitVote = 0, kReadyVote = 1, kBarrierVote = 2;
  struct Ballot {
    std::vector<int8_t> votes;  // per rank: -1 none, kExit, kReady, kBarrier
    std::vector<Vote> ready;    // per rank: its ready vote (the input it carried)
  };
  Ballot& Tally(const Slot& at);
  void Cast(const Slot& at, int rank, Vote v);
  int rank_, size_;
  bool active_ = false;
  int64_t epoch_ = 0;  // the epoch entered last (active or not)
  int64_t position_ = 0;
  int64_t groups_run_ = 0;  // in this epoch: positions that ran the group
  std::vector<Response> groups_;
  std::unordered_map<std::string, std::pair<int32_t, size_t>> ids_;  // name -> (cache id, group)
  std::map<Slot, Ballot> votes_;
  NodePool<std::map<Slot, Ballot>> ballot_pool_;  // a ballot per position: votes_'s nodes, recycled
};

}  // namespace hvdlite
