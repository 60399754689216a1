// Tests of ArenaRing (csrc/runtime/p2p_arena.h), the sender's bookkeeping of
// its point-to-point arena: regions never overlap a live one and stay inside
// the arena, allocation wraps to the start once the oldest regions are freed,
// frees in any order (and a departed peer's) are reclaimed, and a free of a
// region nobody holds is refused. Random traffic is checked against a byte map
// of the arena. Pure logic. Prints "N passed, M failed".
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "coord_test_util.h"
#include "runtime/p2p_arena.h"

using namespace hvdlite;
using namespace coordtest;

namespace {

void TestWrapsAndReclaims() {
  ArenaRing ring(1024);
  uint64_t a = 0, b = 0, c = 0, d = 0, bytes = 0;
  Check(ring.Allocate(400, 1, &a) && a == 0, "the first region starts the arena");
  Check(ring.Allocate(400, 2, &b) && b == 448, "the next follows it, 64-byte aligned");
  Check(!ring.Allocate(400, 1, &c), "no room past the end while the start is in use");
  Check(ring.Free(b, 2, &bytes) && bytes == 448, "a newer region frees first (out of order)");
  Check(!ring.Allocate(400, 1, &c), "its space stays taken until the older one is freed");
  Check(!ring.Free(a, 2, &bytes), "a peer cannot free another peer's region");
  Check(ring.Free(a, 1, &bytes), "the oldest region frees");
  Check(ring.Allocate(600, 1, &c) && c == 0, "an empty arena starts over at 0");
  Check(ring.Allocate(300, 2, &d) && d == 640, "then after it");
  Check(ring.Free(c, 1, &bytes) && ring.Allocate(500, 3, &a) && a == 0, "and wraps to 0 past the end");
  Check(!ring.Allocate(200, 3, &b), "a wrapped ring has room only up to its oldest region");
  ring.FreePeer(2);
  Check(ring.Allocate(500, 3, &b) && b == 512, "a departed peer's regions are reclaimed");
  Check(!ring.Allocate(2048, 1, &c), "a region larger than the arena never fits");
  Check(!ring.Free(12345, 3, &bytes), "freeing an offset nobody holds is refused");
}

void TestRandomTrafficNeverOverlaps() {
  const uint64_t cap = 64 << 10;
  ArenaRing ring(cap);
  std::vector<int> owner(cap, -1);                    // which live region holds each byte
  std::map<uint64_t, std::pair<uint64_t, int>> live;  // offset -> (bytes, peer)
  std::mt19937 rng(5);
  bool ok = true;
  int placed = 0;
  for (int step = 0; step < 20000 && ok; ++step) {
    if (rng() % 2 == 0 || live.empty()) {
      const uint64_t want = 1 + rng() % 9000;
      const int peer = static_cast<int>(rng() % 4);
      uint64_t at = 0;
      if (!ring.Allocate(want, peer, &at)) continue;
      ok = at % 64 == 0 && at + want <= cap;
      for (uint64_t i = at; ok && i < at + want; ++i) ok = owner[i] < 0;
      for (uint64_t i = at; ok && i < at + want; ++i) owner[i] = step;
      live[at] = {want, peer};
      ++placed;
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      uint64_t bytes = 0;
      ok = ring.Free(it->first, it->second.second, &bytes) && bytes >= it->second.first;
      for (uint64_t i = it->first; i < it->first + it->second.first; ++i) owner[i] = -1;
      live.erase(it);
    }
  }
  Check(ok && placed > 5000, "random traffic: regions inside the arena, never over a live one (" +
                                 std::to_string(placed) + " placed)");
}

}  // namespace

int main() {
  TestWrapsAndReclaims();
  TestRandomTrafficNeverOverlaps();
  return Report();
}
