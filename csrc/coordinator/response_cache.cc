#include "coordinator/response_cache.h"

namespace hvdlite {

int32_t ResponseCache::Bind(const std::vector<Request>& reqs) {
  if (reqs.empty()) return -1;
  auto key = std::make_pair(reqs[0].process_set, reqs[0].name);
  int32_t id;
  auto it = ids_.find(key);
  if (it != ids_.end()) {
    id = it->second;
  } else {
    if (entries_.size() >= capacity_) return -1;
    id = static_cast<int32_t>(entries_.size());
    entries_.emplace_back();
    ids_[key] = id;
  }
  auto& entry = entries_[id];
  entry.clear();
  for (const auto& r : reqs) {
    Request stored = r;
    stored.cache_id = -1;
    entry[r.rank] = std::move(stored);
  }
  return id;
}

bool ResponseCache::Expand(int32_t id, int rank, Request* out) const {
  if (id < 0 || static_cast<size_t>(id) >= entries_.size()) return false;
  auto it = entries_[id].find(rank);
  if (it == entries_[id].end()) return false;
  *out = it->second;
  return true;
}

void LocalRequestCache::Compact(Request* r) const {
  auto it = by_name_.find(r->name);
  if (it != by_name_.end() && it->second.second.SameSignature(*r)) r->cache_id = it->second.first;
}

void LocalRequestCache::Remember(const Request& r, int32_t id) {
  if (id < 0) {
    by_name_.erase(r.name);
    return;
  }
  Request stored = r;
  stored.cache_id = -1;
  by_name_[r.name] = {id, std::move(stored)};
}

}  // namespace hvdlite
