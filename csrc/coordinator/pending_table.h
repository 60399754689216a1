// PendingTable: the coordinator's record of the tensors that some, but not yet
// every, member of their process set has submitted: per tensor, what each
// member sent (a full request, or a response cache id), since when, and
// whether it is ready to decide (every member submitted it or has joined).
//
// It records and answers; it decides nothing. The Coordinator validates a
// ready tensor's requests (coordinator/validation.h), pushes its response or
// error, and erases the entry; it also fails entries (stalls, deadlocks,
// shutdown, a removed set) with the answers the table gives (who submitted,
// who is missing, what each rank waits in).
//
// A member that sent a cache hit is kept as its id only (hit_ids, reqs[i] left
// empty) until a slow path needs its request (Materialize): when every member
// hits one id, the cached decision is replayed and no request is ever rebuilt
// (SharedHit).
//
// Member index i of an entry is the i-th rank (ascending) of its process set;
// a set's membership does not change while it has entries (a removal fails
// them first, Coordinator::FailPendingOf).
//
// Ownership: owned by the Coordinator; reads the process set table (not owned,
// must outlive it). Threading: single-threaded (rank 0's background thread).
// Never blocks; no I/O; time comes from the caller.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/deadlock.h"
#include "coordinator/messages.h"
#include "coordinator/process_sets.h"
#include "coordinator/response_cache.h"

namespace hvdlite {

// One tensor some members have submitted.
struct PendingTensor {
  using Clock = std::chrono::steady_clock;
  Request first;                 // the first submission, in full (messages, timeline)
  std::vector<Request> reqs;     // by member index: valid where have[i] && hit_ids[i] < 0 (empty: none yet)
  std::vector<int32_t> hit_ids;  // by member index: the cache id it sent, or -1
  std::vector<bool> have;        // by member index: it has submitted
  int count = 0;                 // members that have submitted
  int hits = 0;                  // of them, those kept as a cache id
  Clock::time_point first_seen;
  Clock::time_point last_warned;

  // Keeps what `member` sent unless it has submitted already: the cache id
  // `hit_id` when >= 0 (`r` unused, may be null), else the request *r (moved from).
  void Keep(size_t member, int32_t hit_id, Request* r);
  // Records that `member` has submitted. False, changing nothing, when it had
  // (only a protocol bug gets there: the runtime refuses a name in flight twice).
  bool Mark(size_t member);
  // Every member of `ranks` has submitted it or is in `joined`. O(1) when
  // `joined` is empty (this runs once per request).
  bool Ready(const std::vector<int>& ranks, const std::set<int>& joined) const;
  // The cache id every one of the `members` members sent, or -1 (some sent a
  // full request, or two ids differ).
  int32_t SharedHit(size_t members) const;
  // Restores the requests of members kept as cache ids (from `cache`; an id
  // already dropped there falls back to `first`, as ids outlive hits).
  void Materialize(const std::vector<int>& ranks, const ResponseCache& cache);
  // After Materialize: the submitted requests and their global ranks, and the
  // members that did not submit (`absent`: joined, once Ready).
  void Split(const std::vector<int>& ranks, std::vector<Request>* submitted, std::vector<int>* submitters,
             std::vector<int>* absent) const;
  // The global ranks of `ranks` that have submitted it.
  std::vector<int> Submitters(const std::vector<int>& ranks) const;
  // `ranks` split into those that have submitted it and those that have not.
  void Partition(const std::vector<int>& ranks, std::vector<int>* ready, std::vector<int>* missing) const;
};

class PendingTable {
 public:
  using Clock = PendingTensor::Clock;
  using Key = std::pair<int32_t, std::string>;  // (process set, tensor name)
  using Map = std::map<Key, PendingTensor>;
  using iterator = Map::iterator;
  using const_iterator = Map::const_iterator;

  explicit PendingTable(const ProcessSetTable* sets) : sets_(sets) {}

  bool empty() const { return map_.empty(); }
  iterator begin() { return map_.begin(); }
  iterator end() { return map_.end(); }
  const_iterator begin() const { return map_.begin(); }
  const_iterator end() const { return map_.end(); }
  iterator find(const Key& key) { return map_.find(key); }
  iterator erase(iterator it) { return map_.erase(it); }
  void erase(const Key& key) { map_.erase(key); }
  // The first entry of process set `set` (a set's entries are consecutive, by name).
  iterator FirstOf(int32_t set) { return map_.lower_bound(Key{set, std::string()}); }

  // The entry of `r`'s tensor (r.process_set, r.name), whose set has `members`
  // members. When none is open, a new one (first = r, no member submitted yet,
  // first seen at `now`), and *opened = true.
  iterator Open(const Request& r, size_t members, Clock::time_point now, bool* opened);

  // For the deadlock check: adds to *undecided every open tensor some rank in
  // `waits` waits for (point-to-point receives excepted: AddReceives), with who
  // submitted it and who must still (members in `joined` never must).
  void AddWaitedFor(const std::map<int, RankWaits>& waits, const std::set<int>& joined,
                    std::map<WaitKey, UndecidedTensor>* undecided) const;
  // For stall messages: what each of `ranks` waits in, from its oldest open
  // submission ("rank 0 waits in a barrier, rank 1 in reducescatter of 'x'").
  std::string DescribeWaits(const std::vector<int>& ranks) const;
  // Whether some open tensor was first seen `limit` or longer before `now`.
  bool AnyWaited(Clock::time_point now, std::chrono::duration<double> limit) const;

 private:
  const ProcessSetTable* sets_;  // not owned
  Map map_;
};

}  // namespace hvdlite
