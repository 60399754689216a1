// ResponseCache: remembers each negotiated tensor's requests under a small id
// so that in steady state a rank's request is 8 bytes (rank, id) instead of the
// full signature.
//
// A bounded LRU (Horovod's HOROVOD_CACHE_CAPACITY; 0 disables it) with
// admission on the second sighting: a (process set, name) is cached only when
// it is decided a second time while it is still remembered among the recently
// seen once names (a key-only list of 2 * capacity + 16 entries: room for a
// full steady-state set plus as many one-offs between two of its sightings).
// Unnamed operations get a fresh `*.noname.N` name per call, so they never get
// past that list and never push the steady-state set out of the cache.
//
// Consistency across ranks: only the coordinator decides what is cached and
// evicted. Ids are never reused, so an id means one thing for the life of the
// job. An evicted id is announced to the members of its process set
// (TakeEvictions, delivered in the ResponseList) and kept as a retired entry
// that still expands, because a worker may have sent the id before it applied
// the notice; it is dropped once every member has acknowledged the notice's
// sequence number (Acknowledge, from RequestList::cache_ack).
//
// Threading: owned by the coordinator (background thread of rank 0).
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/messages.h"

namespace hvdlite {

// One eviction the members of `ranks` must learn: forget `id`. `seq` orders
// evictions (1, 2, ...) so that acknowledgements can be a single number.
struct CacheEviction {
  int32_t id = -1;
  int64_t seq = 0;
  std::vector<int> ranks;
};

// What the coordinator decided for a cached tensor: replayed, without
// validating again, when every member sends that id again (the members'
// requests are then the ones validated when it was decided).
struct CachedDecision {
  Response response;       // cache_ids = {the entry's id}
  std::string fusion_key;  // empty = never fused
  int64_t bytes = 0;
};

class ResponseCache {
 public:
  using Key = std::pair<int32_t, std::string>;  // (process set, name)
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}
  // Records a decided tensor's member requests (one per rank) and, when
  // given, its decision (Replay). Returns its id when it is (now) cached,
  // else -1: on its first sighting, when the cache is disabled, or once the
  // id space is spent. Admitting a name to a full cache evicts the least
  // recently decided one (see TakeEvictions). O(members) comparisons; only
  // requests that differ from the first member's are copied.
  int32_t Bind(const std::vector<Request>& reqs, const CachedDecision* decided = nullptr);
  // Restores rank's full request for a live or retired `id`; false when unknown.
  bool Expand(int32_t id, int rank, Request* out) const;
  // The (process set, name) of a live or retired `id`, or null when unknown.
  const Key* KeyOf(int32_t id) const;
  // The decision Bind recorded for live `id` (null when retired, unknown,
  // bound without one or for other than `members` members), marked most
  // recently decided as Bind would. A rank holds an id only after executing
  // the response that bound it, so `members` hits of one id come from the
  // very members it was bound for.
  const CachedDecision* Replay(int32_t id, size_t members);
  // Evictions since the last call, oldest first (to announce to their ranks).
  std::vector<CacheEviction> TakeEvictions();
  // Highest eviction sequence number handed out so far (0 = none).
  int64_t eviction_seq() const { return seq_; }
  // `rank` has applied every eviction notice addressed to it up to `seq`:
  // retired entries every member has acknowledged are dropped.
  void Acknowledge(int rank, int64_t seq);
  size_t size() const { return live_.size(); }
  size_t retired() const { return retired_.size(); }

 private:
  struct Entry {
    Key key;
    Request common;                              // the first member's request (rank aside)
    std::unordered_map<int, Request> differing;  // members whose request is not `common`'s
    std::vector<int> ranks;
    bool has_decision = false;
    CachedDecision decision;
    std::list<int32_t>::iterator lru;  // live entries only
    int64_t seq = 0;                   // retired entries: their eviction's number
  };
  // True on the second sighting of `key` (and forgets it); otherwise notes it.
  bool SeenBefore(const Key& key);
  void EvictLeastRecent();
  static void Store(const std::vector<Request>& reqs, Entry* e);
  const Entry* Find(int32_t id) const;

  size_t capacity_;
  int32_t next_id_ = 0;
  int64_t seq_ = 0;
  std::map<Key, int32_t> ids_;                       // live key -> id
  std::unordered_map<int32_t, Entry> live_;          // id -> entry
  std::list<int32_t> lru_;                           // live ids, most recent first
  std::list<Key> seen_once_;                         // probation, most recent first
  std::map<Key, std::list<Key>::iterator> seen_at_;  // key -> its place in seen_once_
  std::map<int32_t, Entry> retired_;                 // evicted, not acknowledged by all
  std::unordered_map<int, int64_t> acked_;           // rank -> highest seq applied
  std::vector<CacheEviction> evictions_;             // not taken yet
};

// Worker side: the requests this rank sent last under each cached name.
// Threading: background thread of each rank.
class LocalRequestCache {
 public:
  // Rewrites `r` to its compact form when an identical request is cached.
  void Compact(Request* r) const;
  // The cache id of an identical cached request, or -1.
  int32_t CachedId(const Request& r) const;
  // Called when a response executes: `id` < 0 forgets the name.
  void Remember(const Request& r, int32_t id);
  // Eviction notices of a received ResponseList; applied by ApplyEvictions,
  // which the caller runs once every response received with them has executed
  // (so an older response cannot re-remember an evicted id).
  void QueueEvictions(const std::vector<int32_t>& ids, int64_t seq);
  void ApplyEvictions();
  // The highest eviction sequence number applied (RequestList::cache_ack).
  int64_t acked() const { return acked_; }
  void Clear();

 private:
  std::unordered_map<std::string, std::pair<int32_t, Request>> by_name_;
  std::unordered_map<int32_t, std::string> name_of_;  // id -> name
  std::vector<int32_t> queued_;
  int64_t queued_seq_ = 0;
  int64_t acked_ = 0;
};

}  // namespace hvdlite
