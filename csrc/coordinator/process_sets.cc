#include "coordinator/process_sets.h"

#include <algorithm>

namespace hvdlite {

void ProcessSetTable::Reset(int world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_.clear();
  std::vector<int> all(world_size);
  for (int i = 0; i < world_size; ++i) all[i] = i;
  sets_[0] = std::make_shared<const std::vector<int>>(std::move(all));
}

void ProcessSetTable::Add(int32_t id, std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::lock_guard<std::mutex> lock(mu_);
  sets_[id] = std::make_shared<const std::vector<int>>(std::move(ranks));
}

void ProcessSetTable::Remove(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_.erase(id);
}

bool ProcessSetTable::Exists(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sets_.count(id) != 0;
}

std::vector<int> ProcessSetTable::Ranks(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? std::vector<int>{} : *it->second;
}

std::shared_ptr<const std::vector<int>> ProcessSetTable::Members(int32_t id) const {
  static const auto none = std::make_shared<const std::vector<int>>();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? none : it->second;
}

int ProcessSetTable::Size(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? 0 : static_cast<int>(it->second->size());
}

int ProcessSetTable::MemberIndex(int32_t id, int global_rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return -1;
  const std::vector<int>& ranks = *it->second;
  auto pos = std::lower_bound(ranks.begin(), ranks.end(), global_rank);
  if (pos == ranks.end() || *pos != global_rank) return -1;
  return static_cast<int>(pos - ranks.begin());
}

std::vector<int32_t> ProcessSetTable::Ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> ids;
  for (const auto& kv : sets_) ids.push_back(kv.first);
  return ids;
}

}  // namespace hvdlite
