// ResponseCache: remembers each negotiated tensor's requests under a small id
// so that in steady state a rank's request is 8 bytes (rank, id) instead of the
// full signature. Ids are handed out only by the coordinator and never reused,
// so a worker and the coordinator can never disagree on what an id means; when
// the cache is full new tensors simply travel uncompressed.
// Threading: owned by the coordinator (background thread of rank 0).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/messages.h"

namespace hvdlite {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}
  // Stores these member requests (one per rank) under the tensor's id,
  // assigning a new id if needed. Returns the id, or -1 when the cache is full.
  int32_t Bind(const std::vector<Request>& reqs);
  // Restores rank's full request for `id`; false when unknown.
  bool Expand(int32_t id, int rank, Request* out) const;

 private:
  size_t capacity_;
  std::map<std::pair<int32_t, std::string>, int32_t> ids_;  // (set, name) -> id
  std::vector<std::unordered_map<int, Request>> entries_;   // id -> rank -> request
};

// Worker side: the requests this rank sent last under each cached name.
class LocalRequestCache {
 public:
  // Rewrites `r` to its compact form when an identical request is cached.
  void Compact(Request* r) const;
  void Remember(const Request& r, int32_t id);
  void Clear() { by_name_.clear(); }

 private:
  std::unordered_map<std::string, std::pair<int32_t, Request>> by_name_;
};

}  // namespace hvdlite
