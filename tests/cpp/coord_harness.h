// A Coordinator over `world` ranks (all in set 0) on a fake clock, for the
// coordinator's pure-logic tests (test_coordinator.cc, test_negotiation_runs.cc).
// No sockets, no threads, no wall time.
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "coord_test_util.h"
#include "coordinator/coordinator.h"

namespace coordtest {

struct Harness {
  using Clock = hvdlite::Coordinator::Clock;
  hvdlite::Config cfg;
  hvdlite::ProcessSetTable sets;
  Clock::time_point now{};  // the fake clock; moved by Advance()
  std::unique_ptr<hvdlite::Coordinator> coord;

  explicit Harness(int world, int64_t cache_capacity = 1024) {
    cfg.CACHE_CAPACITY = cache_capacity;
    sets.Reset(world);
    coord.reset(new hvdlite::Coordinator(cfg, &sets, world, nullptr, [this] { return now; }));
  }
  void Advance(double seconds) {
    now += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  void Submit(const hvdlite::Request& r) {
    hvdlite::RequestList list;
    list.requests.push_back(r);
    coord->Add(r.rank, list);
  }
  void SubmitAll(const hvdlite::Request& r, const std::vector<int>& ranks) {
    for (const hvdlite::Request& q : FromRanks(r, ranks)) Submit(q);
  }
  // Drain() into per-rank lists; empty when nothing was sent.
  std::vector<hvdlite::ResponseList> Drain() {
    std::vector<hvdlite::ResponseList> out;
    if (!coord->Drain(&out)) out.clear();
    return out;
  }
};

}  // namespace coordtest
