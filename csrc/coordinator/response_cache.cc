#include "coordinator/response_cache.h"

#include <algorithm>
#include <limits>

namespace hvdlite {

// Most members of a tensor send the same request but for their rank: one
// copy serves them all (memory and time O(1) per such member, not a Request).
void ResponseCache::Store(const std::vector<Request>& reqs, Entry* e) {
  e->differing.clear();
  e->ranks.clear();
  e->common = reqs[0];
  e->common.cache_id = -1;
  for (const auto& r : reqs) {
    e->ranks.push_back(r.rank);
    if (r.SameSignature(e->common)) continue;
    Request stored = r;
    stored.cache_id = -1;
    e->differing[r.rank] = std::move(stored);
  }
  if (!std::is_sorted(e->ranks.begin(), e->ranks.end())) std::sort(e->ranks.begin(), e->ranks.end());
}

bool ResponseCache::SeenBefore(const Key& key) {
  auto it = seen_at_.find(key);
  if (it != seen_at_.end()) {
    seen_once_.erase(it->second);
    seen_at_.erase(it);
    return true;
  }
  seen_once_.push_front(key);
  seen_at_[key] = seen_once_.begin();
  if (seen_once_.size() > 2 * capacity_ + 16) {
    seen_at_.erase(seen_once_.back());
    seen_once_.pop_back();
  }
  return false;
}

void ResponseCache::EvictLeastRecent() {
  const int32_t id = lru_.back();
  lru_.pop_back();
  auto it = live_.find(id);
  Entry e = std::move(it->second);
  live_.erase(it);
  ids_.erase(e.key);
  e.seq = ++seq_;
  evictions_.push_back(CacheEviction{id, e.seq, e.ranks});
  retired_[id] = std::move(e);
}

int32_t ResponseCache::Bind(const std::vector<Request>& reqs, const CachedDecision* decided) {
  if (capacity_ == 0 || reqs.empty()) return -1;
  Key key{reqs[0].process_set, reqs[0].name};
  auto it = ids_.find(key);
  int32_t id = -1;
  Entry* e = nullptr;
  if (it != ids_.end()) {
    id = it->second;
    e = &live_[id];
    lru_.splice(lru_.begin(), lru_, e->lru);  // most recently decided
  } else {
    if (!SeenBefore(key) || next_id_ == std::numeric_limits<int32_t>::max()) return -1;
    if (live_.size() >= capacity_) EvictLeastRecent();
    id = next_id_++;
    e = &live_[id];
    e->key = key;
    lru_.push_front(id);
    e->lru = lru_.begin();
    ids_[key] = id;
  }
  Store(reqs, e);
  e->has_decision = decided != nullptr;
  if (decided != nullptr) {
    e->decision = *decided;
    e->decision.response.cache_ids.assign(1, id);
  }
  return id;
}

const ResponseCache::Entry* ResponseCache::Find(int32_t id) const {
  auto live = live_.find(id);
  if (live != live_.end()) return &live->second;
  auto retired = retired_.find(id);
  return retired == retired_.end() ? nullptr : &retired->second;
}

bool ResponseCache::Expand(int32_t id, int rank, Request* out) const {
  const Entry* e = Find(id);
  if (e == nullptr) return false;
  auto it = e->differing.find(rank);
  if (it != e->differing.end()) {
    *out = it->second;
    return true;
  }
  if (!std::binary_search(e->ranks.begin(), e->ranks.end(), rank)) return false;
  *out = e->common;
  out->rank = rank;
  return true;
}

const ResponseCache::Key* ResponseCache::KeyOf(int32_t id) const {
  const Entry* e = Find(id);
  return e == nullptr ? nullptr : &e->key;
}

const CachedDecision* ResponseCache::Replay(int32_t id, size_t members) {
  auto live = live_.find(id);
  if (live == live_.end() || !live->second.has_decision || live->second.ranks.size() != members)
    return nullptr;
  lru_.splice(lru_.begin(), lru_, live->second.lru);
  return &live->second.decision;
}

std::vector<CacheEviction> ResponseCache::TakeEvictions() {
  std::vector<CacheEviction> out;
  out.swap(evictions_);
  return out;
}

void ResponseCache::Acknowledge(int rank, int64_t seq) {
  int64_t& acked = acked_[rank];
  if (seq <= acked) return;
  acked = seq;
  for (auto it = retired_.begin(); it != retired_.end();) {
    const Entry& e = it->second;
    bool all = std::all_of(e.ranks.begin(), e.ranks.end(), [&](int r) {
      auto a = acked_.find(r);
      return a != acked_.end() && a->second >= e.seq;
    });
    it = all ? retired_.erase(it) : std::next(it);
  }
}

void LocalRequestCache::Compact(Request* r) const {
  const int32_t id = CachedId(*r);
  if (id >= 0) r->cache_id = id;
}

int32_t LocalRequestCache::CachedId(const Request& r) const {
  auto it = by_name_.find(r.name);
  return it != by_name_.end() && it->second.second.SameSignature(r) ? it->second.first : -1;
}

void LocalRequestCache::Remember(const Request& r, int32_t id) {
  auto old = by_name_.find(r.name);
  if (old != by_name_.end()) {
    name_of_.erase(old->second.first);
    by_name_.erase(old);
  }
  if (id < 0) return;
  Request stored = r;
  stored.cache_id = -1;
  by_name_[r.name] = {id, std::move(stored)};
  name_of_[id] = r.name;
}

void LocalRequestCache::QueueEvictions(const std::vector<int32_t>& ids, int64_t seq) {
  queued_.insert(queued_.end(), ids.begin(), ids.end());
  queued_seq_ = std::max(queued_seq_, seq);
}

void LocalRequestCache::ApplyEvictions() {
  for (int32_t id : queued_) {
    auto it = name_of_.find(id);
    if (it == name_of_.end()) continue;
    by_name_.erase(it->second);
    name_of_.erase(it);
  }
  queued_.clear();
  acked_ = std::max(acked_, queued_seq_);
}

void LocalRequestCache::Clear() {
  by_name_.clear();
  name_of_.clear();
  queued_.clear();
  queued_seq_ = acked_ = 0;
}

}  // namespace hvdlite
