// Helpers for the coordinator's pure-logic tests (test_response_cache.cc,
// test_coordinator.cc): a check counter and request builders. No sockets, no
// threads, no wall time.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "coordinator/messages.h"

namespace coordtest {

inline int g_passed = 0;
inline int g_failed = 0;

inline void Check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  std::printf("FAILED: %s\n", what.c_str());
  std::fflush(stdout);
}

inline bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A float32 allreduce of `elements` values named `name` submitted by `rank`.
inline hvdlite::Request Allreduce(const std::string& name, int rank, int64_t elements = 4, int32_t set = 0) {
  hvdlite::Request r;
  r.rank = rank;
  r.type = hvdlite::OpType::kAllreduce;
  r.name = name;
  r.dtype = hvdlite::DataType::kFloat32;
  r.shape = {elements};
  r.process_set = set;
  return r;
}

// The same request as submitted by each of `ranks` (what the coordinator
// collects for one tensor).
inline std::vector<hvdlite::Request> FromRanks(const hvdlite::Request& r, const std::vector<int>& ranks) {
  std::vector<hvdlite::Request> out;
  for (int rank : ranks) {
    out.push_back(r);
    out.back().rank = rank;
  }
  return out;
}

inline int Report() {
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

}  // namespace coordtest
