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
//     At position p (group p mod |S|) it casts one vote (it travels the vote
//     tree, below):
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
//  The vote tree: votes travel a binomial tree rooted at rank 0 (VoteTree:
//  rank r's parent is r with its lowest set bit cleared; its subtree is the
//  consecutive ranks [r, r + lowbit(r))). A rank reports its subtree's outcome
//  to its parent once it has its own vote and every child's report (all ready,
//  all barrier, or exit), and reports exit at once, without waiting, as soon
//  as it knows one. Rank 0 decides from its children's reports and sends the
//  decision down; each rank forwards it to its children on receipt (with two
//  ranks, rank 0 sends rank 1 its vote instead and each decides from both, so
//  a position costs one one-way trip, as before the tree). So a
//  position costs 2(n-1) messages in all (about two per rank: one report up,
//  one decision down, each relayed by the parents), in 2 log2(n) hops, and a
//  rank talks to its parent and at most log2(n) children only.
//  Bounded waits (runtime/steady_driver.cc): a live rank's engine votes within
//  its patience (at most 1 s) once it knows that votes are being cast at its
//  position (a child's report or stalled notice, or a wake from its parent).
//  A rank whose subtree still misses votes a stall delay (the patience) after
//  it knew of one sends a kStalled notice up, naming the ranks it misses, and
//  wakes its children that have not reported; every rank on the way up does
//  the same. So an idle rank votes (exit) within two patiences of the first
//  vote, and a hung one is named: rank 0 warns as the stall inspector does
//  after HVDLITE_STALL_CHECK_TIME_SECONDS, and after HVDLITE_TIMEOUT_SECONDS
//  fails, as a hung transfer does, with a kFail decision that carries its
//  message to every rank. A rank that waits for rank 0's decision longer than
//  that fails by itself (rank 0 itself may be hung). A departed child counts
//  as exit; a departed parent makes this rank's subtree leave the schedule.
//  Votes that carry the data: a ready vote for a group that is one small CPU
//  allreduce (below the size where Allreduce switches from recursive doubling
//  to the ring, on a backend that would run recursive doubling for it) carries
//  the voter's packed, prescaled input (Executor::VotedInput). Once every
//  rank voted ready with its input, every rank holds every input and reduces
//  them itself, along recursive doubling's tree (the same bits as running it):
//  reports carry their subtree's inputs up, the decision carries all of them
//  down, so the group costs the vote's messages instead of a vote and then the
//  collective's rounds (Executor::VotedInput bounds the inputs to 16 KiB in all). Whether a position runs
//  this way depends only on the votes, which every rank sees alike: a rank whose vote carries no input
//  (another backend, a larger group) makes every rank run the collective. An
//  exit vote discards the inputs with the votes; nothing reached the data plane.
//  Why replay whole fused responses rather than agree per cache hit: the
//  schedule fixes the fusion groups and their order too, so every rank runs
//  the same collectives in the same order with one vote per group, without
//  anyone deciding anything.
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

// The binomial tree the votes travel, rooted at rank 0 (pure arithmetic).
struct VoteTree {
  // One past the last rank of r's subtree: r + lowbit(r) (rank 0: every rank), at most size.
  static int SubtreeEnd(int r, int size);
  static int Parent(int r) { return r & (r - 1); }  // r > 0
  // r's children, in rank order: r + 1, r + 2, r + 4, ... below SubtreeEnd(r).
  static std::vector<int> Children(int r, int size);
};

// Rank side: where this rank stands in the announced schedule, and the votes
// as they pass through it on the vote tree. What it has to send accumulates in
// an outbox (TakeOutgoing) that the runtime, or a simulation, delivers.
class SteadySchedule {
 public:
  explicit SteadySchedule(int rank = 0, int size = 1);
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
  // A vote-tree message from `peer` (`wire`: its serialized form, forwarded
  // as is). Messages of epochs that are over are dropped; those of an epoch
  // not entered yet, or of a later position, are kept for it. A decision is
  // forwarded to the children on receipt.
  // Takes m's payload (moves it).
  void OnMessage(int peer, VoteMessage& m, const std::string& wire);
  // The same for a message parsed by Deserialize(std::string&&, ...): m.payload
  // holds the whole wire, which is what a decision forwards.
  void OnMessage(int peer, VoteMessage& m) { OnMessage(peer, m, m.payload); }
  // This rank's vote at position(): ready or exit; or `own` (ready, barrier
  // or exit), keeping the input it carries. A second vote is ignored.
  void VoteSelf(bool ready);
  void VoteSelf(Vote own);
  bool VotedSelf() const;  // this rank has voted at position()
  // Some vote at position() is known here (own, a child's report or stall
  // notice, a wake, a decision): an idle rank's patience starts.
  bool Aware() const;
  // This rank's subtree has voted at position() (own vote and every child's report).
  bool SubtreeComplete() const;
  // The subtree has missed votes for the stall delay: report it up (naming
  // the ranks missing) and wake the children that have not reported. Once
  // per position; a later change resends the notice.
  void Stall();
  // Ranks known here not to have voted at position(): this rank, and the
  // unreported part of its children's subtrees (all of it unless a stall
  // notice named fewer). On rank 0 that is every rank missing.
  std::vector<int> Missing() const;
  // Rank 0: gives up waiting at position(); every rank's Decide() becomes kFail with `why`.
  void Fail(const std::string& why);
  // `peer` departed (shut down) without a word at position(): a child counts
  // as exit; the parent's decision never comes, so this subtree leaves.
  void PeerDeparted(int peer);
  enum class Outcome { kWait, kRun, kBarrier, kExit, kFail };
  // Rank 0's decision at position(), as far as it reached this rank: kRun
  // (every rank voted ready), kBarrier (every rank voted barrier), kExit (some
  // rank voted exit, or the votes differ), kFail (rank 0 gave up: failure()),
  // kWait (not decided yet).
  Outcome Decide() const;
  std::string failure() const;
  // When Decide() is kRun and every rank's ready vote carried an input of one
  // length: true, with parts[r] = rank r's input (valid until Advance()).
  bool VotedInputs(std::vector<const char*>* parts) const;
  // After running position(): on to the next one (and, when it ran the
  // group rather than a barrier, to the next group).
  void Advance();
  // What this rank must send: (peer, wire) pairs, in order. Swaps with *out.
  // `shared`, when set, is the message instead of `wire`: this rank's own
  // vote, sent as the executor packed it (Vote::wire, no copy). It lives in the
  // current ballot, so an outbox must be taken and sent before Advance(),
  // Enter() or Leave() (the runtime sends right after each call that fills it).
  struct Outgoing {
    int peer;
    std::string wire;
    const std::string* shared = nullptr;
    const std::string& bytes() const { return shared != nullptr ? *shared : wire; }
  };
  void TakeOutgoing(std::vector<Outgoing>* out);
  // The buffer of an earlier position's own vote (empty when none), for the
  // next vote to pack into: a vote per position then allocates nothing.
  std::string TakeSpareWire() { return std::move(spare_wire_); }
  const std::vector<int>& children() const { return children_; }
  int parent() const { return rank_ == 0 ? -1 : VoteTree::Parent(rank_); }

 private:
  using Slot = std::pair<int64_t, int64_t>;  // (epoch, position)
  // Bytes received in a vote message, kept where they arrived: buf[off, end).
  struct Held {
    std::string buf;
    size_t off = 0;
    const char* data() const { return buf.data() + off; }
    size_t size() const { return buf.size() - off; }
    void clear() {
      buf.clear();
      off = 0;
    }
    void Take(VoteMessage& m) {
      buf = std::move(m.payload);
      off = m.payload_offset;
    }
  };
  struct Ballot {
    int8_t own = -1;            // -1 none, else a VoteMessage outcome
    Vote own_vote;              // this rank's ready vote with the input it carried (kept as packed: no copy)
    std::vector<int8_t> child;  // per child: -1 none, else its subtree's outcome
    std::vector<Held> child_inputs;                   // per child: its subtree's inputs (empty: none)
    std::vector<std::vector<int32_t>> child_missing;  // per child: its last stall notice
    std::vector<uint8_t> child_stalled;
    bool aware = false, reported = false, stalled = false, woke = false;
    int8_t peer = -1;      // two ranks, on rank 1: rank 0's own vote (PairDecide)
    Held peer_input;       // and the input it carried
    int8_t decision = -1;  // rank 0's outcome, once it reached this rank
    uint32_t input_size = 0;
    Held decided;  // the decision's payload: every rank's input, or the failure
  };
  Ballot& Tally(const Slot& at);
  void FindCurrent();  // current_ = the ballot of (epoch_, position_), if any
  // Queues this rank's own vote (with its input) to `peer` as a report, sent from
  // own_vote's wire when the executor packed it there (no copy).
  void SendOwn(const Slot& at, Ballot& b, int peer, uint8_t outcome, uint32_t input_size);
  Ballot* Current();
  const Ballot* Current() const;
  bool Over(const Slot& at) const;
  void Update(const Slot& at, Ballot& b);
  void Decided(const Slot& at, Ballot& b, uint8_t outcome, uint32_t input_size, std::string payload);
  void SendUp(const Slot& at, Ballot& b, VoteMessage::Type type, uint8_t outcome, uint32_t input_size,
              const char* payload, size_t size);
  void Wake(const Slot& at, Ballot& b);
  void PairDecide(const Slot& at, Ballot& b);
  void SendStalled(const Slot& at, Ballot& b);
  std::vector<int> MissingAt(const Ballot& b) const;
  int ChildIndex(int peer) const;
  int rank_, size_;
  std::vector<int> children_;
  bool active_ = false;
  int64_t epoch_ = 0;  // the epoch entered last (active or not)
  int64_t position_ = 0;
  int64_t groups_run_ = 0;  // in this epoch: positions that ran the group
  std::vector<Response> groups_;
  std::unordered_map<std::string, std::pair<int32_t, size_t>> ids_;  // name -> (cache id, group)
  std::map<Slot, Ballot> votes_;
  std::string spare_wire_;     // a recycled ballot's own-vote buffer (TakeSpareWire)
  Ballot* current_ = nullptr;  // votes_'s ballot at (epoch_, position_), or null (FindCurrent)
  NodePool<std::map<Slot, Ballot>> ballot_pool_;  // a ballot per position: votes_'s nodes, recycled
  std::vector<Outgoing> outbox_;
};

}  // namespace hvdlite
