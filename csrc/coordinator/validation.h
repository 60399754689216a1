// Cross-rank validation of one tensor's requests, run on the coordinator once
// every member of the process set has submitted it.
#pragma once
#include <vector>

#include "common/status.h"
#include "coordinator/messages.h"

namespace hvdlite {

// `reqs[i]` is member i's request; `ranks[i]` its global rank. Returns a
// Mismatch / InvalidArgument / NotSupported status whose message names the
// tensor, the ranks and the fix, or OK. On OK, fills the response's per-member
// data: `out->first_dims` (allgather) or `out->split_matrix` (alltoall).
Status ValidateRequests(const std::vector<Request>& reqs, const std::vector<int>& ranks, Response* out);

}  // namespace hvdlite
