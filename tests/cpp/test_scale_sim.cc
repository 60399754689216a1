// The control-plane simulation (tests/cpp/scale_sim.h) at small N: a job of
// N simulated ranks negotiates a 20-tensor model over the relay tree until the
// coordinator announces a schedule, runs steady-state steps on the vote tree, and the
// deadlock detector fails a diverged step. Checks the outcomes and the exact
// message counts the design promises (benchmarks/scale_simulation.py measures
// CPU at up to 16,384 ranks). Pure logic. Prints "N passed, M failed".
#include "coord_test_util.h"
#include "coordinator/relay.h"
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
  const int64_t children0 = static_cast<int64_t>(VoteTree::Children(0, n).size());
  Check(negotiated.sent[0] == children0 && negotiated.received[0] == children0,
        "negotiation: rank 0 gets one message from each tree child and sends each one back" + at);
  bool relayed = true;
  for (int r = 1; r < n; ++r) {
    const int64_t children = static_cast<int64_t>(VoteTree::Children(r, n).size());
    relayed &= negotiated.sent[r] == 1 + children && negotiated.received[r] == 1 + children;
  }
  Check(relayed,
        "negotiation: a rank sends its parent one message (its subtree's lists) and each child one" + at);
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

// The relay's wire: rank 0 sends one entry per run of ranks with the same
// responses, each relay splits it by subtree; a cut or forged message is refused.
void TestRelayWire() {
  NegotiationRelay root(0, 8), four(4, 8);
  std::vector<NegotiationRelay::Delivery> mine;
  for (int r = 1; r < 8; ++r) root.Down(r, r + 1, r == 6 ? "other" : "same", &mine);
  std::vector<NegotiationRelay::Outgoing> out;
  root.TakeOutgoing(&out);
  Check(mine.empty() && out.size() == 3 && out[2].peer == 4, "one message per child of rank 0");
  std::vector<NegotiationRelay::Delivery> at4;
  Check(four.OnMessage(0, out[2].wire, &at4).ok() && at4.size() == 1 && at4[0].rank == 4 &&
            at4[0].payload == "same",
        "rank 4 keeps its own responses");
  std::vector<NegotiationRelay::Outgoing> on;
  four.TakeOutgoing(&on);
  Check(on.size() == 2 && on[0].peer == 5 && on[1].peer == 6, "and passes the rest to its children");
  Check(out[2].wire.size() < 5 + 3 * 12 + 3 * 6, "runs of equal responses travel once (5, then 6, then 7)");
  std::string cut = out[2].wire;
  cut.pop_back();
  Check(!four.OnMessage(0, cut, &at4).ok(), "a cut relay message is refused");
  std::string forged = out[2].wire;
  forged[5] = 9;  // an entry starting past the job
  Check(!four.OnMessage(0, forged, &at4).ok(), "an entry outside the job is refused");
}

}  // namespace

int main() {
  TestRelayWire();
  for (int n : {2, 3, 5, 16, 64}) TestJob(n);
  TestDeadlockDetectedAtScale();
  return Report();
}
