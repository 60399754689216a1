// The control-plane simulation at large N (issue 29 part 5), driven by
// benchmarks/scale_simulation.py. For each N on the command line: negotiates
// a model (one tensor per line of the shapes file, float32 allreduces) until
// the coordinator announces a schedule (first sighting: full requests; second:
// full requests again, now cached; then cache hits only), runs steady-state steps on the vote
// tree, and times one negotiation cycle in which every rank reports a blocked
// caller (the deadlock detector's input). Prints one JSON object per phase
// and N: CPU per step (rank 0's, the mean over ranks), messages per rank per
// step, and the spread over the repeated steps.
//
//   scale_simulation SHAPES_FILE STEADY_STEPS N [N ...]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "scale_sim.h"

using namespace hvdlite;
using scalesim::ScaleSim;
using scalesim::StepCost;

namespace {

std::vector<Request> ReadModel(const char* path) {
  std::vector<Request> model;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    Request r;
    r.type = OpType::kAllreduce;
    r.dtype = DataType::kFloat32;
    r.name = "resnet50.param" + std::to_string(model.size());
    std::stringstream dims(line);
    std::string dim;
    while (std::getline(dims, dim, ',')) r.shape.push_back(std::stoll(dim));
    model.push_back(std::move(r));
  }
  return model;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One JSON line: a phase's steps, the median and range of rank 0's and the mean CPU per step.
void Print(int n, const char* phase, const std::vector<StepCost>& steps, int errors) {
  std::vector<double> rank0, mean;
  for (const StepCost& s : steps) {
    rank0.push_back(s.Rank0Cpu());
    mean.push_back(s.MeanCpu());
  }
  const StepCost& last = steps.back();
  std::printf(
      "{\"n\": %d, \"phase\": \"%s\", \"steps\": %zu, \"rank0_cpu_s\": %.9g, \"rank0_cpu_min_s\": %.9g, "
      "\"rank0_cpu_max_s\": %.9g, \"mean_cpu_s\": %.9g, \"mean_cpu_min_s\": %.9g, \"mean_cpu_max_s\": %.9g, "
      "\"messages_per_rank\": %.6g, \"max_messages\": %lld, \"rank0_messages\": %lld, \"bytes\": %lld, "
      "\"positions\": %d, \"errors\": %d}\n",
      n, phase, steps.size(), Median(rank0), *std::min_element(rank0.begin(), rank0.end()),
      *std::max_element(rank0.begin(), rank0.end()), Median(mean),
      *std::min_element(mean.begin(), mean.end()), *std::max_element(mean.begin(), mean.end()),
      last.MessagesPerRank(), static_cast<long long>(last.MaxMessages()),
      static_cast<long long>(last.sent[0] + last.received[0]), static_cast<long long>(last.bytes),
      last.positions, errors);
  std::fflush(stdout);
}

void Run(int n, const std::vector<Request>& model, int steady_steps) {
  ScaleSim sim(n, model);
  std::vector<StepCost> first{sim.NegotiationStep()}, second{sim.NegotiationStep()}, cached;
  Print(n, "negotiation_first", first, static_cast<int>(sim.errors().size()));
  Print(n, "negotiation_second", second, static_cast<int>(sim.errors().size()));
  for (int k = 0; k < 8 && !sim.scheduled(); ++k) cached.push_back(sim.NegotiationStep());
  if (!cached.empty()) Print(n, "negotiation_cached", cached, static_cast<int>(sim.errors().size()));
  std::vector<StepCost> steady;
  for (int k = 0; k < steady_steps && sim.scheduled(); ++k) steady.push_back(sim.SteadyStep());
  if (!steady.empty()) Print(n, "steady", steady, static_cast<int>(sim.errors().size()));
  // Every rank blocked on the whole step while negotiating: the deadlock
  // detector looks at every report (and finds nothing: every tensor completes).
  ScaleSim blocked(n, model);
  blocked.NegotiationStep();
  std::vector<StepCost> waits{blocked.NegotiationStep(/*blocked=*/true)};
  Print(n, "negotiation_blocked", waits, static_cast<int>(blocked.errors().size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s SHAPES_FILE STEADY_STEPS N [N ...]\n", argv[0]);
    return 2;
  }
  const std::vector<Request> model = ReadModel(argv[1]);
  const int steady_steps = std::atoi(argv[2]);
  for (int i = 3; i < argc; ++i) Run(std::atoi(argv[i]), model, steady_steps);
  return 0;
}
