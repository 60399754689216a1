// NodePool: recycles the nodes of a node-based std container (std::map,
// std::unordered_map) so that a map whose elements come and go once per
// operation (handles, in-flight tensors, steady-state ballots) stops paying an
// allocation and a free per element.
//
//   NodePool<std::map<K, V>> pool;
//   auto it = pool.Insert(&map, [&](K& key) { key = ...; });  // a new element
//   ...set it->second completely: a recycled value holds its last contents...
//   pool.Erase(&map, it);                                      // keeps the node
//
// Erase extracts the element's node instead of freeing it and keeps up to
// kMaxSpare of them; Insert sets a spare node's key in place (a string key
// keeps its capacity) and inserts it, or emplaces a new element when there is
// no spare. The caller must not insert a key that is already in the map.
// Threading: none of its own; guard the pool with the map's lock.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace hvdlite {

template <class Map, size_t kMaxSpare = 8>
class NodePool {
 public:
  using Key = typename Map::key_type;

  template <class SetKey>
  typename Map::iterator Insert(Map* map, SetKey&& set_key) {
    return Insert(map, map->end(), std::forward<SetKey>(set_key));
  }

  // The same, with `hint` as std::map's insert takes it (the element the new
  // one goes before, e.g. the lower_bound a caller already looked up): then
  // the insert does not search the map again.
  template <class SetKey>
  typename Map::iterator Insert(Map* map, typename Map::const_iterator hint, SetKey&& set_key) {
    if (spare_.empty()) {
      Key key{};
      set_key(key);
      return map->try_emplace(hint, std::move(key));
    }
    typename Map::node_type node = std::move(spare_.back());
    spare_.pop_back();
    set_key(node.key());
    return map->insert(hint, std::move(node));
  }

  void Erase(Map* map, typename Map::iterator it) {
    typename Map::node_type node = map->extract(it);
    if (spare_.size() < kMaxSpare) spare_.push_back(std::move(node));
  }

  // Nodes kept for reuse (at most kMaxSpare).
  size_t spare() const { return spare_.size(); }

 private:
  std::vector<typename Map::node_type> spare_;
};

}  // namespace hvdlite
