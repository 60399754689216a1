// Tests of negotiation at scale as pure logic (issue 29): cache hits decided
// from the cached decision without rebuilding requests, ranges of ranks that
// sent the same list (a relay's merged run) taken at once, per-rank lists
// built as runs of ranks (Coordinator::DrainRuns), and the relay merging equal
// lists going up without reordering any one rank's lists. No sockets, no
// threads, no wall time. Prints "N passed, M failed".
#include <chrono>
#include <cstring>
#include <memory>

#include "coord_harness.h"
#include "coord_test_util.h"
#include "coordinator/coordinator.h"
#include "coordinator/relay.h"

using namespace hvdlite;
using namespace coordtest;

namespace {

// Every rank of `ranks` sends `r` in full; returns rank `look`'s only response.
Response FullRound(Harness* h, const Request& r, const std::vector<int>& ranks, int look) {
  h->SubmitAll(r, ranks);
  const std::vector<ResponseList> out = h->Drain();
  return out.empty() || out[look].responses.size() != 1 ? Response{} : out[look].responses[0];
}

RequestList Hits(const std::vector<int32_t>& ids) {
  RequestList list;
  for (int32_t id : ids) {
    Request q;
    q.cache_id = id;
    list.requests.push_back(q);
  }
  return list;
}

// An allgather whose members contribute different first dimensions is cached
// per member; when every member hits its id again (rank 0 alone, ranks 1-3 as
// one run), the replayed response is the validated one.
void TestAllHitsReplayTheDecision() {
  Harness h(4);
  Request g = Allreduce("g", 0);
  g.type = OpType::kAllgather;
  std::vector<Response> rounds;
  for (int round = 0; round < 2; ++round) {
    for (int r = 0; r < 4; ++r) {
      Request q = g;
      q.rank = r;
      q.shape = {r + 1, 3};
      RequestList list;
      list.requests.push_back(q);
      h.coord->Add(r, list);
    }
    std::vector<ResponseList> out;
    h.coord->Drain(&out);
    rounds.push_back(out.at(2).responses.at(0));
  }
  const int32_t id = rounds[1].cache_ids.at(0);
  Check(id >= 0 && rounds[1].first_dims == std::vector<int64_t>({1, 2, 3, 4}), "second sighting: cached");
  h.coord->Add(0, Hits({id}));
  h.coord->Add(1, 4, Hits({id}));
  std::vector<ResponseList> out;
  Check(h.coord->Drain(&out) && out.size() == 4, "hits from a run of ranks complete the tensor");
  for (int r = 0; r < 4; ++r) {
    const auto& rs = out[r].responses;
    Check(rs.size() == 1 && rs[0].names == std::vector<std::string>{"g"} &&
              rs[0].cache_ids == std::vector<int32_t>{id} &&
              rs[0].first_dims == std::vector<int64_t>({1, 2, 3, 4}) && rs[0].type == OpType::kAllgather,
          "rank " + std::to_string(r) + " gets the cached decision, first dims included");
  }
}

// A member that sends its request in full with a changed shape next to the
// others' hits is validated against their (expanded) requests: a mismatch
// error names the ranks.
void TestHitsBesideAChangedRequestAreValidated() {
  Harness h(3);
  FullRound(&h, Allreduce("w", 0), {0, 1, 2}, 0);
  const int32_t id = FullRound(&h, Allreduce("w", 0), {0, 1, 2}, 0).cache_ids.at(0);
  h.coord->Add(0, 2, Hits({id}));
  Request changed = Allreduce("w", 2, /*elements=*/5);
  RequestList list;
  list.requests.push_back(changed);
  h.coord->Add(2, list);
  std::vector<ResponseList> out;
  Check(h.coord->Drain(&out) && out.size() == 3, "decided");
  const Response& r = out[1].responses.at(0);
  Check(r.error_code == StatusCode::kMismatch && Contains(r.error, "[4]") && Contains(r.error, "[5]"),
        "the mismatch names both shapes: " + r.error);
}

// Lists as runs: a set {1, 2} splits the world of 4 into three runs, each
// with the list Drain gives its ranks.
void TestListRuns() {
  Harness h(4);
  h.sets.Add(1, {1, 2});
  h.SubmitAll(Allreduce("all", 0), {0, 1, 2, 3});
  h.SubmitAll(Allreduce("pair", 1, 4, 1), {1, 2});
  std::vector<ListRun> runs;
  Check(h.coord->DrainRuns(&runs), "drained");
  Check(runs.size() == 3 && runs[0].lo == 0 && runs[0].hi == 1 && runs[1].lo == 1 && runs[1].hi == 3 &&
            runs[2].lo == 3 && runs[2].hi == 4,
        "runs [0,1) [1,3) [3,4)");
  if (runs.size() != 3) return;
  Check(runs[0].list.responses.size() == 1 && runs[1].list.responses.size() == 2 &&
            runs[1].list.responses[1].names == std::vector<std::string>{"pair"} &&
            runs[2].list.responses.size() == 1,
        "the set's members get its response too, after the global one");
}

// A relay wire (coordinator/relay.h) of (lo, hi, payload) entries.
std::string RelayWire(const std::vector<std::pair<std::pair<int, int>, std::string>>& entries) {
  std::string w(1, static_cast<char>(ControlKind::kRelay));
  const uint32_t count = static_cast<uint32_t>(entries.size());
  w.append(reinterpret_cast<const char*>(&count), 4);
  for (const auto& e : entries) {
    const int32_t lo = e.first.first, hi = e.first.second;
    const uint32_t len = static_cast<uint32_t>(e.second.size());
    w.append(reinterpret_cast<const char*>(&lo), 4);
    w.append(reinterpret_cast<const char*>(&hi), 4);
    w.append(reinterpret_cast<const char*>(&len), 4);
    w += e.second;
  }
  return w;
}

std::string Runs(const std::vector<NegotiationRelay::Delivery>& ds) {
  std::string s;
  for (const auto& d : ds)
    s += "[" + std::to_string(d.rank) + "," + std::to_string(d.hi) + ")" + d.payload + " ";
  return s;
}

void TestRelayMergesWithoutReorderingARank() {
  NegotiationRelay root(0, 8);
  std::vector<NegotiationRelay::Delivery> mine;
  // Equal lists, in descending order (children report as they finish): one run.
  Check(root.OnMessage(4, RelayWire({{{6, 7}, "A"}, {{5, 6}, "A"}, {{4, 5}, "A"}}), &mine).ok(), "parsed");
  Check(Runs(mine) == "[4,7)A ", "equal lists of ranks 4-6 arrive as one run: " + Runs(mine));
  // Rank 5's first list is Z, its second A: A must not move ahead of Z.
  mine.clear();
  Check(
      root.OnMessage(4, RelayWire({{{4, 5}, "A"}, {{5, 6}, "Z"}, {{5, 6}, "A"}, {{6, 7}, "A"}}), &mine).ok(),
      "parsed");
  Check(Runs(mine) == "[4,5)A [5,6)Z [5,7)A ", "rank 5 gets Z then A: " + Runs(mine));
}

}  // namespace

int main() {
  TestAllHitsReplayTheDecision();
  TestHitsBesideAChangedRequestAreValidated();
  TestListRuns();
  TestRelayMergesWithoutReorderingARank();
  return Report();
}
