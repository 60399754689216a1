// ProcessSetTable: the subgroups of ranks collectives can run on. Set 0 is the
// global set. Ids are handed out by the coordinator through a negotiated
// add_process_set, so every rank agrees on them.
// Thread-safety: all methods lock; the background thread writes, the Python
// thread reads (rank/size queries).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace hvdlite {

class ProcessSetTable {
 public:
  void Reset(int world_size);
  void Add(int32_t id, std::vector<int> ranks);
  void Remove(int32_t id);
  bool Exists(int32_t id) const;
  // Ascending global ranks of the set; empty when the id is unknown.
  std::vector<int> Ranks(int32_t id) const;
  // The same without a copy (the coordinator looks a set up per request: with
  // thousands of ranks a copy each time cost O(ranks) per request). Never null;
  // stays valid and unchanged after the set is removed or replaced.
  std::shared_ptr<const std::vector<int>> Members(int32_t id) const;
  // Number of members of the set; 0 when the id is unknown.
  int Size(int32_t id) const;
  // Member index of `global_rank` in the set, or -1.
  int MemberIndex(int32_t id, int global_rank) const;
  std::vector<int32_t> Ids() const;

 private:
  mutable std::mutex mu_;
  std::map<int32_t, std::shared_ptr<const std::vector<int>>> sets_;
};

}  // namespace hvdlite
