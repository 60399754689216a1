// Rank 0's output side of negotiation: fusing decided responses, and turning
// them into the list each rank receives (the coordinator's Drain).
//
// Lists are built per run of consecutive ranks that receive the same one
// (ListRun): a rank's list is every fused response whose recipients include
// it, so ranks r-1 and r differ only where some recipient set starts or ends
// between them. A job whose responses all go to every rank is one run, and
// rank 0 builds (and the runtime serializes) one list per cycle, not one per
// rank.
//
// Pure functions; single-threaded (rank 0's engine holder).
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "coordinator/messages.h"
#include "coordinator/response_cache.h"

namespace hvdlite {

// One decided tensor (or an error), with who runs it and what fusion needs.
struct DecidedResponse {
  Response response;
  std::vector<int> recipients;               // global ranks
  int64_t bytes = 0;                         // for fusion
  std::string fusion_key;                    // empty = never fused
  std::chrono::steady_clock::time_point at;  // when it was decided
};

// A list for the ranks [lo, hi).
struct ListRun {
  int lo, hi;
  ResponseList list;
};

// Allreduces fuse when set, dtype, op, device and both scales are equal: the
// key is those fields' bytes (exact for the doubles, and cheap to build).
std::string FusionKey(const Request& r);
// Bytes of the tensor a request describes.
int64_t TensorBytes(const Request& r);

// Greedy, order-preserving fusion: an allreduce joins the most recent response
// with the same fusion key (same set, dtype, op, scales: so the same
// recipients) if the combined size stays within `threshold`. Empties *decided.
std::vector<DecidedResponse> Fuse(std::deque<DecidedResponse>* decided, int64_t threshold);

// The lists of every rank of a `world_size` job, as runs (ascending, covering
// every rank): the fused responses each rank receives, then the evictions
// addressed to it (after the responses that bound those ids, so a rank that
// applies them after executing its list never keeps a stale id).
std::vector<ListRun> BuildListRuns(int world_size, std::vector<DecidedResponse>* fused,
                                   std::vector<CacheEviction>* evictions, int64_t eviction_seq,
                                   bool shutdown);

}  // namespace hvdlite
