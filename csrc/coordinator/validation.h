// Cross-rank validation of one tensor's requests, run on the coordinator once
// every member of the process set has submitted it.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/messages.h"

namespace hvdlite {

// `reqs[i]` is member i's request; `ranks[i]` its global rank. Returns a
// Mismatch / InvalidArgument / NotSupported status whose message names the
// tensor, the ranks and the fix, or OK. On OK, fills the response's per-member
// data: `out->first_dims` (allgather) or `out->split_matrix` (alltoall).
Status ValidateRequests(const std::vector<Request>& reqs, const std::vector<int>& ranks, Response* out);
// Joined members (`joined`, global ranks) take part with identity values:
// NotSupported, naming them, for what they cannot (as in Horovod).
Status CheckJoinedParticipation(const Request& r0, const std::vector<int>& joined);
// Whether global rank r.rank may submit `r` at all: its process set exists
// (`members`, ascending, not empty), it is a member, and no member has shut
// down (`shut_down`). InvalidArgument / Aborted naming the tensor otherwise.
Status CheckSubmission(const Request& r, const std::vector<int>& members, const std::set<int>& shut_down);
// "0, 1, 2": ranks for messages.
std::string JoinRanks(const std::vector<int>& ranks);

}  // namespace hvdlite
