// Tests of the coordinator's response cache (csrc/coordinator/response_cache.*)
// as pure logic: ids, hits, the bounded LRU, and admission that keeps one-off
// names (unnamed ops get a fresh `noname.N` per call) from pushing the
// steady-state set out. Prints "N passed, M failed".
#include "coord_test_util.h"
#include "coordinator/response_cache.h"

using namespace hvdlite;
using namespace coordtest;

namespace {

const std::vector<int> kRanks = {0, 1};

// Binds one decided tensor (both ranks' requests); returns its cache id.
int32_t Decide(ResponseCache* cache, const std::string& name) {
  return cache->Bind(FromRanks(Allreduce(name, 0), kRanks));
}

bool Hits(ResponseCache* cache, const std::string& name, int32_t id) {
  Request out;
  return id >= 0 && cache->Expand(id, 1, &out) && out.name == name && out.rank == 1;
}

// A job first runs a loop of 3,000 unnamed one-off allreduces, then its
// steady-state training loop: the steady names must still be cached.
void TestOneOffsFirstThenSteady() {
  ResponseCache cache(1024);
  for (int i = 0; i < 3000; ++i) Decide(&cache, "allreduce.noname." + std::to_string(i));
  for (int step = 0; step < 3; ++step) {
    for (int t = 0; t < 10; ++t) {
      std::string name = "grad." + std::to_string(t);
      int32_t id = Decide(&cache, name);
      if (step > 0) Check(Hits(&cache, name, id), "steady " + name + " cached after 3000 one-offs");
    }
    Decide(&cache, "metric.noname.step" + std::to_string(step));
  }
}

// The steady set is cached first; then 3,000 one-offs run (one per step,
// interleaved): the steady names keep their ids and still hit.
void TestSteadySurvivesOneOffs() {
  ResponseCache cache(64);
  std::vector<int32_t> ids(10);
  for (int step = 0; step < 2; ++step)
    for (int t = 0; t < 10; ++t) ids[t] = Decide(&cache, "grad." + std::to_string(t));
  for (int i = 0; i < 3000; ++i) {
    Decide(&cache, "noname." + std::to_string(i));
    if (i % 300 == 0) Decide(&cache, "grad.0");  // the loop touches some steady names
  }
  for (int t = 0; t < 10; ++t) {
    std::string name = "grad." + std::to_string(t);
    Check(Hits(&cache, name, ids[t]), name + " still hits its id after 3000 one-offs");
    Check(Decide(&cache, name) == ids[t], name + " keeps its id");
  }
}

// A full cache evicts the least recently decided name; the evicted id is
// announced to its ranks, still expands until every rank acknowledged it, and
// is never handed out again.
void TestEvictionIsAnnouncedAndRetired() {
  ResponseCache cache(2);
  for (int step = 0; step < 2; ++step)
    for (const char* n : {"a", "b"}) Decide(&cache, n);
  const int32_t a = Decide(&cache, "a"), b = Decide(&cache, "b");  // b is now the most recent
  Check(cache.TakeEvictions().empty(), "no eviction while the cache has room");
  Decide(&cache, "c");  // first sighting: not admitted, nothing evicted
  Check(cache.TakeEvictions().empty() && cache.size() == 2, "a first sighting evicts nothing");
  const int32_t c = Decide(&cache, "c");  // second sighting: admitted, evicts a
  Check(c >= 0 && c != a && c != b, "an admitted name gets a fresh id");
  std::vector<CacheEviction> ev = cache.TakeEvictions();
  Check(ev.size() == 1 && ev[0].id == a && ev[0].seq == 1 && ev[0].ranks == kRanks,
        "the least recently decided name is evicted and announced to its ranks");
  Check(Hits(&cache, "a", a), "an evicted id still expands until every rank acknowledged it");
  cache.Acknowledge(0, 1);
  Check(Hits(&cache, "a", a), "one rank's acknowledgement is not enough");
  cache.Acknowledge(1, 1);
  Check(!Hits(&cache, "a", a) && cache.retired() == 0, "acknowledged by all: the retired entry is gone");
  Decide(&cache, "a");
  const int32_t a2 = Decide(&cache, "a");
  Check(a2 >= 0 && a2 != a && a2 != b && a2 != c, "ids are never reused");
}

void TestDisabled() {
  ResponseCache cache(0);
  for (int i = 0; i < 3; ++i) Check(Decide(&cache, "x") == -1, "capacity 0 disables the cache");
  Check(cache.size() == 0 && cache.TakeEvictions().empty(), "a disabled cache holds nothing");
}

// Worker side: eviction notices apply only when ApplyEvictions runs, and then
// the name travels in full again; acked() reports the notices' sequence.
void TestLocalCacheForgets() {
  LocalRequestCache local;
  Request r = Allreduce("w", 1);
  local.Remember(r, 7);
  Request q = r;
  local.Compact(&q);
  Check(q.cache_id == 7, "a remembered request is compacted");
  local.QueueEvictions({7}, 3);
  q = r;
  local.Compact(&q);
  Check(q.cache_id == 7 && local.acked() == 0, "a queued eviction is not applied yet");
  local.ApplyEvictions();
  q = r;
  local.Compact(&q);
  Check(q.cache_id == -1 && local.acked() == 3, "an applied eviction forgets the id and is acknowledged");
}

}  // namespace

int main() {
  TestOneOffsFirstThenSteady();
  TestSteadySurvivesOneOffs();
  TestEvictionIsAnnouncedAndRetired();
  TestDisabled();
  TestLocalCacheForgets();
  return Report();
}
