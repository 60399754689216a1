// Coordinator: runs on rank 0's background thread and decides, for the whole
// job, which tensors run and in what order.
//
// Every rank sends it the requests for tensors its caller submitted. When all
// members of a tensor's process set have submitted it, the coordinator
// validates the requests (shapes, dtypes, ops, roots must agree) and appends a
// response, or an error response, to one global sequence. Drain() fuses
// consecutive compatible allreduce responses up to the fusion threshold and
// hands each rank the responses of the sets it belongs to, in that one order;
// so any two ranks execute the collectives they share in the same order
// whatever order their callers submitted them in.
//
// Undecided tensors (who submitted what, since when) live in a PendingTable
// (coordinator/pending_table.h) that this class owns; the coordinator decides
// and fails them, the table records and answers.
//
// It is pure planning: requests in, responses out, no I/O (the runtime moves
// the bytes), and time comes from an injectable clock, so tests drive it
// without sockets or wall time (tests/cpp/test_coordinator.cc).
//
// Threading: single-threaded (rank 0's background thread). Never blocks.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "coordinator/deadlock.h"
#include "coordinator/messages.h"
#include "coordinator/pending_table.h"
#include "coordinator/process_sets.h"
#include "coordinator/response_cache.h"
#include "coordinator/response_lists.h"
#include "coordinator/steady_state.h"
#include "coordinator/timeline.h"

namespace hvdlite {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;
  using NowFn = std::function<Clock::time_point()>;
  // `timeline` (may be null) receives each tensor's negotiation span; `now`
  // (default: the steady clock) times cycle holds and stalls.
  Coordinator(const Config& cfg, ProcessSetTable* sets, int world_size, Timeline* timeline, NowFn now = {});

  // Takes the requests `rank` sent; expands cached (compact) requests. Takes
  // the rank's blocked callers too (list.has_waits) and, when every tensor
  // some blocked ranks wait for can never complete, fails those tensors on
  // every member at once with a Mismatch error naming who waits for what
  // (coordinator/deadlock.h) in the next Drain; HVDLITE_DEADLOCK_CHECK_DISABLE
  // turns that off.
  void Add(int rank, const RequestList& list) { Add(rank, rank + 1, list); }
  // The same list sent by each of the ranks [lo, hi) (a relay's merged run):
  // a cache hit costs O(1) per rank (a flag), not a parsed request.
  void Add(int lo, int hi, const RequestList& list);
  // Moves the decided responses into per-rank lists (index = global rank).
  // Returns false when there is nothing to send (*per_rank untouched). With
  // HVDLITE_STEADY_STATE, it may end the lists with a learned schedule
  // (coordinator/steady_state.h); it announces no other until EndSchedule().
  bool Drain(std::vector<ResponseList>* per_rank);
  // The same lists as runs of consecutive ranks that receive the same list
  // (ascending, covering every rank): usually one run for the whole job, so
  // rank 0's work per cycle grows with the responses, not with ranks x
  // responses (each list is built, and serialized by the runtime, once).
  bool DrainRuns(std::vector<ListRun>* runs);
  // Rank 0 left schedule mode: learn from scratch again.
  void EndSchedule() {
    schedule_active_ = false;
    learner_.Reset();
  }
  // Whether a schedule may be announced (not while the autotuner moves the fusion knobs).
  void AllowSchedule(bool allow) { schedule_allowed_ = allow; }
  // Warns about tensors some ranks have not submitted; once one has waited
  // the stall shutdown time, fails it and every tensor stalled past the
  // warning time. Returns milliseconds until the next check is due.
  int CheckStalls();
  bool AllRanksShutDown() const { return static_cast<int>(shutdown_ranks_.size()) == world_size_; }
  // Tuning knobs (the autotuner moves them): fusion threshold in bytes, and
  // how long decided responses are held so later ones can fuse with them.
  void SetFusionThreshold(int64_t bytes) { fusion_threshold_ = bytes; }
  void SetCycleTimeMs(double ms) { cycle_time_ms_ = ms; }
  // Milliseconds until held responses are due (a large value when none are held).
  int MsUntilDue() const;
  const ResponseCache& cache() const { return cache_; }
  // Any thread: tensors in the response cache, and evictions so far, as of
  // the last Drain (hvdlite_get_stats).
  int64_t cache_entries() const { return cache_entries_.load(std::memory_order_relaxed); }
  int64_t cache_evictions() const { return cache_evictions_.load(std::memory_order_relaxed); }

 private:
  using Key = PendingTable::Key;
  using Pending = PendingTensor;
  using Decided = DecidedResponse;

  // hit_id >= 0: `r` is the expansion of that cache hit.
  void AddOne(Request r, int32_t hit_id = -1);
  // Cache hits of `id` from the ranks [lo, hi): once some member submitted the
  // tensor this cycle, O(1) per rank with no Request built; otherwise (and
  // for anything unusual) the expansion through AddOne (AddExpanded).
  void AddHits(int lo, int hi, int32_t id);
  void AddExpanded(int rank, int32_t id);
  // Records `member`'s submission and decides the tensor once it is complete
  // (true: decided, `it` erased).
  bool Submit(PendingTable::iterator it, const std::vector<int>& ranks, size_t member, int rank);
  // Every member hit the same cached id and none joined: push the cached decision.
  bool DecideFromCache(const Pending& p, const std::vector<int>& ranks);
  void Push(Decided d);  // stamps it with now_() and queues it
  void Decide(const Key& key, Pending& p);
  void DecideError(const Request& r, const std::vector<int>& recipients, const Status& st);
  // The set `set` (members `ranks`) is being removed: its undecided tensors other than `keep` can
  // never complete, so they fail on the members that submitted them (before the id goes to
  // another set, whose tensors of the same name they would otherwise be taken for).
  void FailPendingOf(int32_t set, const std::vector<int>& ranks, const std::string& keep);
  void OnShutdown(int rank);
  void OnJoin(int rank);
  // Feeds the learner; ends the lists with a schedule when it found one.
  void MaybeAnnounce(const std::vector<Decided>& fused, std::vector<ListRun>* runs);
  void CheckDeadlock();

  Config cfg_;
  NowFn now_;
  ProcessSetTable* sets_;
  int world_size_;
  PendingTable pending_;  // the undecided tensors; decided ones move to decided_
  std::deque<Decided> decided_;
  ResponseCache cache_;
  Timeline* timeline_;
  int64_t fusion_threshold_;
  double cycle_time_ms_;
  std::map<int, RankWaits> waits_;   // ranks that reported blocked callers: their latest report
  bool deadlock_check_due_ = false;  // waits or requests arrived since the last check (Drain runs it)
  std::set<int> shutdown_ranks_;
  std::set<int> joined_ranks_;  // ranks inside join(), until every rank has joined
  int last_joined_ = -1;
  bool shutdown_announced_ = false;
  // Process set ids as Horovod hands them out: a removed set's id is reused,
  // the longest-free first; otherwise the next unused one.
  int32_t TakeSetId() {
    if (free_set_ids_.empty()) return next_set_id_++;
    const int32_t id = free_set_ids_.front();
    free_set_ids_.pop_front();
    return id;
  }
  int32_t next_set_id_ = 1;
  std::deque<int32_t> free_set_ids_;  // removed ids, in the order they were freed
  // add_process_set among members (Request::process_set == kAmongMembers): the id each such
  // registration (by name) is staged under while its members submit. The staged set is in the
  // table from the first submission, so every check sees its members; it is dropped again when
  // the registration fails.
  std::map<std::string, int32_t> staged_sets_;
  int32_t StageAmongMembers(const Request& r);
  // The process set the response to `r` travels under: kAmongMembers for a staged registration
  // (its members queued it so), else r.process_set.
  int32_t WireSet(const Request& r) const;
  std::atomic<int64_t> cache_entries_{0}, cache_evictions_{0};
  ScheduleLearner learner_;
  bool schedule_active_ = false;  // announced, and rank 0 has not left it yet
  bool schedule_allowed_ = true;
  int64_t schedule_epoch_ = 0;
};

}  // namespace hvdlite
