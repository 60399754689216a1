// Deadlock detection: pure logic the coordinator runs on what ranks report.
//
// A rank reports the tensors its blocked callers wait for (a caller blocked in
// synchronize() waits until every tensor of its entry completes). A rank is
// deadlocked when every one of its blocked callers waits for a tensor that can
// never complete; a tensor can never complete when some member that has not
// submitted it is itself deadlocked (a blocked caller submits nothing). The
// largest set of ranks that satisfies both rules at once is the deadlock:
// e.g. rank 0 waits in allreduce 'a' that only rank 0 submitted, while rank 1
// waits in allreduce 'b' that only rank 1 submitted. A rank that is not
// blocked (still computing) may still submit anything, so it is never part of
// a deadlock, nor is a rank waiting for a tensor already decided.
//
// Contract with the ranks: a rank's report is a consistent snapshot of its
// callers' waits and submissions (the tensor queue takes both under one
// lock), and a rank's callers submit from the threads that wait, so a
// reported-blocked rank submits nothing until one of its waited tensors is
// decided.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/messages.h"

namespace hvdlite {

// The coordinator's view of one undecided tensor.
struct UndecidedTensor {
  OpType type = OpType::kAllreduce;
  std::vector<int> submitted;  // global ranks that submitted it, ascending
  std::vector<int> missing;    // global ranks that must still submit it (joined members excluded)
};

struct DeadlockReport {
  std::vector<int> ranks;        // the deadlocked ranks, ascending
  std::vector<WaitKey> tensors;  // every undecided tensor a deadlocked rank waits for: fail these
  std::string message;           // names who waits for what, and the fix
};

// `waits`: the latest report of every rank that reported being blocked;
// `undecided`: at least every undecided tensor some rank in `waits` waits
// for. Returns true and fills *out when some ranks are deadlocked.
bool FindDeadlock(const std::map<int, RankWaits>& waits, const std::map<WaitKey, UndecidedTensor>& undecided,
                  DeadlockReport* out);

}  // namespace hvdlite
