// Bounded NCCL communicator set-up (one per process set), and the settling of
// calls on a non-blocking communicator.
//
// Set-up, for the members of one process set, all through the job's store:
//  1. each member publishes its arrival ("<key>/arrived/<member>");
//  2. member 0 creates the ncclUniqueId and publishes it ("<key>/id"); the
//     others wait for it with Store::Get, bounded by the deadline;
//  3. every member runs ncclCommInitRankConfig with blocking = 0 and polls
//     ncclCommGetAsyncError until the communicator is ready, an error, or the
//     deadline; at the deadline it aborts the communicator (ncclCommAbort).
// A timeout names the members (by global rank) whose arrival is not in the
// store: the ranks that never reached this set-up.
//
// Blocking: at most `timeout_s` in all. Threading: one call at a time per
// communicator (the runtime's background thread).
#pragma once
#include <nccl.h>

#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"

namespace hvdlite {

class Store;

namespace cuda {

struct CommSetup {
  Store* store = nullptr;  // the job's store; not owned
  std::string key;         // unique for this communicator within the job
  std::vector<int> ranks;  // global ranks of the members (for messages)
  int me = 0;              // this process's index in `ranks`
  double timeout_s = 30;   // bound of the whole set-up
  std::string what;        // names the communicator in messages, e.g. "process set 0"
};

// Creates the communicator or returns Timeout naming the missing ranks (or the
// NCCL error); *out is left null on failure (the half-made one is aborted).
Status InitNcclComm(const CommSetup& setup, ncclComm_t* out);

// For a call on a non-blocking communicator that returned `r`: waits while
// NCCL reports ncclInProgress (polling ncclCommGetAsyncError) until `deadline`.
// OK once the call has taken effect; Timeout at the deadline; else NCCL's error.
// *final_result (when given) receives NCCL's last result.
Status SettleNccl(ncclComm_t comm, ncclResult_t r, const char* what, const Deadline& deadline,
                  ncclResult_t* final_result = nullptr);

// The global ranks among `ranks` whose "<key>/arrived/<member>" is missing.
std::vector<int> MissingRanks(Store* store, const std::string& key, const std::vector<int>& ranks);

}  // namespace cuda
}  // namespace hvdlite
