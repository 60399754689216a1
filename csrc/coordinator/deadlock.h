// Deadlock detection: pure logic the coordinator runs on what ranks report.
//
// A rank reports the tensors its blocked callers wait for (a caller blocked in
// synchronize() waits until every tensor of its entry completes). A rank is
// deadlocked when every one of its blocked callers waits for a tensor that can
// never complete; a tensor can never complete when some member that has not
// submitted it is itself deadlocked (a blocked caller submits nothing). The
// largest set of ranks that satisfies both rules at once is the deadlock:
// e.g. rank 0 waits in allreduce 'a' that only rank 0 submitted, while rank 1
// waits in allreduce 'b' that only rank 1 submitted. A point-to-point receive
// (WaitKey::p2p_src >= 0) is a tensor that its receivers "submitted" and only
// its source must still submit (send): rank 0 waiting to receive from rank 1
// while rank 1 waits in anything rank 0 must do first is a deadlock too. A
// rank whose sends are still in flight reports itself not blocked (its engine
// moves them without its callers), so a message on its way is never taken for
// a missing one. A rank that is not
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
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "coordinator/messages.h"

namespace hvdlite {

// The coordinator's view of one undecided tensor.
struct UndecidedTensor {
  OpType type = OpType::kAllreduce;  // kRecv: a point-to-point receive
  int32_t src_in_set = -1;           // kRecv: the source's rank in the process set
  std::vector<int> submitted;        // global ranks that submitted it, ascending
  std::vector<int> missing;          // global ranks that must still submit it (joined members excluded)
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

// Adds to *undecided the point-to-point receives in `waits`: received by the
// ranks that wait for them, missing their source. `members` gives a process
// set's global ranks (ascending), to name the source's rank in the set.
void AddReceives(const std::map<int, RankWaits>& waits,
                 const std::function<std::vector<int>(int32_t)>& members,
                 std::map<WaitKey, UndecidedTensor>* undecided);

// For stall warnings: what each of `ranks` waits in ("rank 0 waits in a
// barrier, rank 1 in allreduce of 'x', rank 2 has submitted nothing"), from
// each rank's oldest undecided submission (`oldest`, by global rank). Lists at
// most 8 ranks: a warning must stay readable at any scale.
std::string DescribeSubmissions(const std::vector<int>& ranks, const std::map<int, const Request*>& oldest);

}  // namespace hvdlite
