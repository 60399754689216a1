// Pure-logic tests of how a collective's algorithm and backend are chosen:
// the algorithm enum of csrc/algorithms (size thresholds, names) and the
// `auto` CPU backend's table (csrc/backend/split_backend.h), including the
// measured table the registry uses. No sockets, no MPI. Prints "N passed, M failed".
#include <cstdio>
#include <cstring>
#include <string>

#include "algorithms/algorithms.h"
#include "algorithms/ring.h"
#include "backend/split_backend.h"

using namespace hvdlite;

namespace {

int g_passed = 0, g_failed = 0;

void Check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL %s\n", what.c_str());
  }
}

void TestAlgorithmThresholds() {
  const int64_t small = alg::kSmallAllreduceBytes;
  Check(AllreduceAlgorithm(0, 2) == Algorithm::kRecursiveDoubling, "allreduce of 0 bytes");
  Check(AllreduceAlgorithm(small - 1, 4) == Algorithm::kRecursiveDoubling,
        "allreduce just below the threshold");
  Check(AllreduceAlgorithm(small, 4) == Algorithm::kRing, "allreduce at the threshold");
  const int64_t tree = alg::kSmallBroadcastBytes;
  Check(BroadcastAlgorithm(tree - 1, 4) == Algorithm::kBinomialTree, "broadcast below the threshold");
  Check(BroadcastAlgorithm(tree, 4) == Algorithm::kPipelinedChain, "broadcast at the threshold, 4 members");
  Check(BroadcastAlgorithm(tree << 4, 2) == Algorithm::kBinomialTree, "broadcast over 2 members");
}

void TestAlgorithmNames() {
  const Algorithm all[] = {Algorithm::kRecursiveDoubling, Algorithm::kRing,
                           Algorithm::kBinomialTree,      Algorithm::kPipelinedChain,
                           Algorithm::kRingAllgatherv,    Algorithm::kPairwiseExchange,
                           Algorithm::kRingReduceScatter};
  for (Algorithm a : all) {
    for (Algorithm b : all) {
      if (a != b) Check(std::strcmp(AlgorithmName(a), AlgorithmName(b)) != 0, "distinct algorithm names");
    }
    Check(std::strcmp(AlgorithmName(a), "unknown") != 0, "every algorithm has a name");
  }
  Check(std::string(AlgorithmName(Algorithm::kRecursiveDoubling)) == "recursive_doubling", "timeline name");
}

void TestAutoTableRanges() {
  AutoTable t;  // all ranges empty: the ring for everything
  Check(!t.AnyMpi(), "empty table has no MPI range");
  Check(!t.UsesMpi(Collective::kAllreduce, 1 << 20), "empty range: ring");
  Check(!t.UsesMpi(Collective::kAlltoall, 1 << 20), "empty alltoall range: ring");
  t.mpi[static_cast<size_t>(Collective::kBroadcast)] = ByteRange{1 << 20, 16 << 20};
  Check(t.AnyMpi(), "one range set");
  Check(!t.UsesMpi(Collective::kBroadcast, (1 << 20) - 1), "below `from`: ring");
  Check(t.UsesMpi(Collective::kBroadcast, 1 << 20), "at `from`: mpi");
  Check(t.UsesMpi(Collective::kBroadcast, (16 << 20) - 1), "below `below`: mpi");
  Check(!t.UsesMpi(Collective::kBroadcast, 16 << 20), "at `below`: ring");
  Check(!t.UsesMpi(Collective::kAllreduce, 4 << 20), "other collectives unaffected");
  t.mpi[static_cast<size_t>(Collective::kAlltoall)] = ByteRange{0, kNoLimit};
  Check(t.UsesMpi(Collective::kAlltoall, 0) && t.UsesMpi(Collective::kAlltoall, 1 << 30),
        "alltoall decides by kind alone");
}

// The measured table: every range well formed, and the ring kept wherever it
// was measured ahead in every run (see the numbers in split_backend.h).
void TestMeasuredTable() {
  for (const ByteRange& r : kMeasuredAutoTable.mpi) Check(r.from >= 0 && r.below >= 0, "non-negative range");
  for (int64_t bytes : {int64_t(4) << 10, int64_t(64) << 10, int64_t(1) << 20, int64_t(64) << 20}) {
    Check(!kMeasuredAutoTable.UsesMpi(Collective::kAllreduce, bytes),
          "allreduce: ring " + std::to_string(bytes));
    Check(!kMeasuredAutoTable.UsesMpi(Collective::kReducescatter, bytes),
          "reducescatter: ring " + std::to_string(bytes));
  }
}

}  // namespace

int main() {
  TestAlgorithmThresholds();
  TestAlgorithmNames();
  TestAutoTableRanges();
  TestMeasuredTable();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
