#include "coordinator/pending_table.h"

namespace hvdlite {

void PendingTensor::Keep(size_t member, int32_t hit_id, Request* r) {
  if (have[member]) return;
  hit_ids[member] = hit_id;
  if (hit_id >= 0) return;
  if (reqs.empty()) reqs.resize(have.size());  // (only for requests sent in full)
  reqs[member] = std::move(*r);
}

bool PendingTensor::Mark(size_t member) {
  if (have[member]) return false;
  have[member] = true;
  ++count;
  if (hit_ids[member] >= 0) ++hits;
  return true;
}

bool PendingTensor::Ready(const std::vector<int>& ranks, const std::set<int>& joined) const {
  if (count == static_cast<int>(ranks.size())) return count > 0;
  if (joined.empty()) return false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!have[i] && !joined.count(ranks[i])) return false;
  }
  return count > 0;
}

int32_t PendingTensor::SharedHit(size_t members) const {
  if (hits != static_cast<int>(members) || members == 0) return -1;
  const int32_t id = hit_ids[0];
  for (int32_t h : hit_ids) {
    if (h != id) return -1;
  }
  return id;
}

void PendingTensor::Materialize(const std::vector<int>& ranks, const ResponseCache& cache) {
  if (reqs.size() < have.size()) reqs.resize(have.size());
  for (size_t i = 0; i < ranks.size() && i < have.size(); ++i) {
    if (!have[i] || hit_ids[i] < 0) continue;
    if (!cache.Expand(hit_ids[i], ranks[i], &reqs[i])) reqs[i] = first;  // (ids outlive hits)
    reqs[i].rank = ranks[i];
    hit_ids[i] = -1;
  }
  hits = 0;
}

void PendingTensor::Split(const std::vector<int>& ranks, std::vector<Request>* submitted,
                          std::vector<int>* submitters, std::vector<int>* absent) const {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (have[i]) {
      submitted->push_back(reqs[i]);
      submitters->push_back(ranks[i]);
    } else {
      absent->push_back(ranks[i]);
    }
  }
}

std::vector<int> PendingTensor::Submitters(const std::vector<int>& ranks) const {
  std::vector<int> out;
  for (size_t i = 0; i < ranks.size() && i < have.size(); ++i) {
    if (have[i]) out.push_back(ranks[i]);
  }
  return out;
}

void PendingTensor::Partition(const std::vector<int>& ranks, std::vector<int>* ready,
                              std::vector<int>* missing) const {
  for (size_t i = 0; i < ranks.size(); ++i) (have[i] ? ready : missing)->push_back(ranks[i]);
}

PendingTable::iterator PendingTable::Open(const Request& r, size_t members, Clock::time_point now,
                                          bool* opened) {
  auto it = map_.try_emplace(Key{r.process_set, r.name}).first;
  PendingTensor& p = it->second;
  *opened = p.have.empty();
  if (*opened) {
    p.first = r;
    p.hit_ids.assign(members, -1);
    p.have.assign(members, false);
    p.first_seen = p.last_warned = now;
  }
  return it;
}

void PendingTable::AddWaitedFor(const std::map<int, RankWaits>& waits, const std::set<int>& joined,
                                std::map<WaitKey, UndecidedTensor>* undecided) const {
  for (const auto& kv : waits) {
    for (const auto& caller : kv.second) {
      for (const WaitKey& key : caller) {
        auto it = key.p2p_src < 0 ? map_.find({key.process_set, key.name}) : map_.end();
        if (it == map_.end() || undecided->count(key)) continue;
        const PendingTensor& p = it->second;
        UndecidedTensor& t = (*undecided)[key];
        std::vector<int> ranks = sets_->Ranks(key.process_set);
        for (size_t i = 0; i < ranks.size() && i < p.have.size(); ++i) {
          if (p.have[i]) {
            t.type = p.first.type;
            t.submitted.push_back(ranks[i]);
          } else if (!joined.count(ranks[i])) {
            t.missing.push_back(ranks[i]);
          }
        }
      }
    }
  }
}

std::string PendingTable::DescribeWaits(const std::vector<int>& ranks) const {
  std::map<int, std::pair<Clock::time_point, const Request*>> oldest;  // rank -> submission
  for (const auto& kv : map_) {
    std::vector<int> members = sets_->Ranks(kv.first.first);
    for (size_t i = 0; i < members.size() && i < kv.second.have.size(); ++i) {
      if (!kv.second.have[i]) continue;
      auto it = oldest.find(members[i]);
      if (it == oldest.end() || kv.second.first_seen < it->second.first)
        oldest[members[i]] = {kv.second.first_seen, &kv.second.first};
    }
  }
  std::map<int, const Request*> submitted;
  for (const auto& kv : oldest) submitted[kv.first] = kv.second.second;
  return DescribeSubmissions(ranks, submitted);
}

bool PendingTable::AnyWaited(Clock::time_point now, std::chrono::duration<double> limit) const {
  bool any = false;
  for (const auto& kv : map_) any |= now - kv.second.first_seen >= limit;
  return any;
}

}  // namespace hvdlite
