// Tests of NodePool (csrc/common/node_pool.h): a map that recycles its nodes
// through the pool holds exactly what a plain map given the same inserts and
// erases holds, for ordered and unordered maps, string keys included, and the
// pool reuses nodes (an element inserted after an erase lives in the erased
// element's node) while keeping no more spares than its bound. Pure logic.
// Prints "N passed, M failed".
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/node_pool.h"
#include "coord_test_util.h"

using namespace hvdlite;
using namespace coordtest;

namespace {

using Key = std::pair<int, std::string>;

// Random inserts (of absent keys) and erases on a pooled and a plain map.
template <class Map, class MakeKey>
void CheckAgainstPlainMap(const char* what, MakeKey make_key) {
  std::mt19937 rng(7);
  Map pooled, plain;
  NodePool<Map, 4> pool;
  bool same = true;
  for (int step = 0; step < 5000 && same; ++step) {
    const auto key = make_key(static_cast<int>(rng() % 40));
    auto it = pooled.find(key);
    if (it == pooled.end()) {
      const int value = step;
      pool.Insert(&pooled, [&](typename Map::key_type& k) { k = key; })->second = value;
      plain[key] = value;
    } else {
      pool.Erase(&pooled, it);
      plain.erase(key);
    }
    same = pooled.size() == plain.size();
    for (const auto& kv : plain) {
      auto found = pooled.find(kv.first);
      same = same && found != pooled.end() && found->second == kv.second;
    }
  }
  Check(same, std::string(what) + ": the pooled map holds what a plain map holds");
}

void TestMatchesPlainMaps() {
  CheckAgainstPlainMap<std::map<Key, int>>("ordered, (int, string) keys", [](int i) {
    return Key{i % 3, "tensor.with.a.name.longer.than.sso." + std::to_string(i)};
  });
  CheckAgainstPlainMap<std::unordered_map<long, int>>("unordered, integer keys",
                                                      [](int i) { return long{i}; });
}

void TestReusesNodes() {
  std::map<Key, int> map;
  NodePool<std::map<Key, int>, 2> pool;
  auto a = pool.Insert(&map, [](Key& k) { k = {0, "first.name.longer.than.sso"}; });
  const void* node = &*a;
  pool.Erase(&map, a);
  Check(map.empty(), "erase removes the element");
  auto b = pool.Insert(&map, [](Key& k) {
    k.first = 1;
    k.second.assign("second");
  });
  Check(&*b == node && b->first == Key{1, "second"} && map.size() == 1,
        "the next insert lives in the erased element's node, with its new key");
  Check(pool.spare() == 0, "the reused node left the spares");
  // Four erased elements with room for two spares: two nodes are kept, two freed.
  for (int i = 0; i < 3; ++i) pool.Insert(&map, [i](Key& k) { k = {2, std::to_string(i)}; })->second = i;
  while (!map.empty()) pool.Erase(&map, map.begin());
  Check(pool.spare() == 2, "at most kMaxSpare nodes are kept");
  for (int i = 0; i < 3; ++i) pool.Insert(&map, [i](Key& k) { k = {3, std::to_string(i)}; })->second = 10 + i;
  Check(pool.spare() == 0 && map.size() == 3 && map.at({3, "0"}) == 10 && map.at({3, "2"}) == 12,
        "inserts take the spares first, then allocate");
}

// Inserts at the lower_bound hint a caller already looked up (TensorQueue::Push),
// from spare nodes and from new ones, keep the map ordered and complete.
void TestHintedInserts() {
  std::map<Key, int> map, plain;
  NodePool<std::map<Key, int>, 3> pool;
  std::mt19937 rng(11);
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 5; ++i) {
      const Key key{static_cast<int>(rng() % 3), std::to_string(rng() % 20)};
      const auto hint = map.lower_bound(key);
      if (hint != map.end() && hint->first == key) continue;
      pool.Insert(&map, hint, [&](Key& k) { k = key; })->second = round;
      plain[key] = round;
    }
    for (int i = 0; i < 4 && !map.empty(); ++i) {
      auto victim = std::next(map.begin(), static_cast<long>(rng() % map.size()));
      plain.erase(victim->first);
      pool.Erase(&map, victim);
    }
  }
  Check(map == plain, "inserts at a lower_bound hint keep the map ordered and complete");
}

}  // namespace

int main() {
  TestMatchesPlainMaps();
  TestReusesNodes();
  TestHintedInserts();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
