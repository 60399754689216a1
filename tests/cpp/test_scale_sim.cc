// The control-plane simulation (tests/cpp/scale_sim.h) at small N: a job of
// N simulated ranks negotiates a 20-tensor model until the coordinator
// announces a schedule, runs steady-state steps on the vote tree, and the
// deadlock detector fails a diverged step. Checks the outcomes and the exact
// message counts the design promises (benchmarks/scale_simulation.py measures
// CPU at up to 16,384 ranks). Pure logic. Prints "N passed, M failed".
#include "coord_test_util.h"
#include "scale_sim.h"

using namespace hvdlite;
using namespace coordtest;
using scalesim::ScaleSim;
using scalesim::StepCost;

namespace {

// 20 float32 tensors of assorted sizes, like a small network's parameters.
std::vector<Request> SmallModel() {
  std::vector<Request> model;
  for (int i = 0; i < 20; ++i)
    model.push_back(Allreduce("layer" + std::to_string(i) + ".weight", 0, 64 << (i % 7)));
  return model;
}

int CeilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

void TestJob(int n) {
  const std::string at = " (n=" + std::to_string(n) + ")";
  ScaleSim sim(n, SmallModel());
  int steps = 0;
  StepCost negotiated;
  while (!sim.scheduled() && steps < 6) {
    negotiated = sim.NegotiationStep();
    ++steps;
  }
  Check(sim.scheduled() && sim.errors().empty(), "the coordinator announces a schedule" + at);
  Check(negotiated.sent[0] == n - 1 && negotiated.received[0] == n - 1 &&
            (n < 2 || (negotiated.sent[n - 1] == 1 && negotiated.received[n - 1] == 1)),
        "negotiation: every rank sends rank 0 one list and gets one back" + at);
  for (int k = 0; k < 3; ++k) {
    const StepCost steady = sim.SteadyStep();
    Check(sim.errors().empty() && steady.positions >= 1, "every rank runs every position" + at);
    const double per_position = steady.MessagesPerRank() / steady.positions;
    Check(per_position == 4.0 * (n - 1) / n,
          "2(n-1) vote messages per position, each sent and received once" + at);
    Check(steady.sent[0] + steady.received[0] == 2 * CeilLog2(n) * steady.positions,
          "rank 0 handles a report and a decision per child: 2 log2(n) per position" + at);
    Check(steady.MaxMessages() <= 2 * CeilLog2(n) * steady.positions,
          "no rank handles more than rank 0" + at);
  }
}

void TestDeadlockDetectedAtScale() {
  const int n = 64;
  ScaleSim sim(n, SmallModel());
  sim.NegotiationStep(/*blocked=*/true, /*skip_last=*/true);
  bool extra = false, last = false;
  for (const std::string& e : sim.errors()) {
    extra |= e.rfind("extra: ", 0) == 0 && Contains(e, "deadlock");
    last |= e.rfind("layer19.weight: ", 0) == 0 && Contains(e, "deadlock");
  }
  Check(sim.errors().size() == 2 && extra && last,
        "every rank blocked, rank 63 on another tensor: the detector fails both, naming them");
}

}  // namespace

int main() {
  for (int n : {2, 3, 5, 16, 64}) TestJob(n);
  TestDeadlockDetectedAtScale();
  return Report();
}
