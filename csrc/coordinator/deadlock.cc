#include "coordinator/deadlock.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace hvdlite {
namespace {

// `ranks` ascending (UndecidedTensor's contract): O(log n) at any scale.
bool Has(const std::vector<int>& ranks, int rank) {
  return std::binary_search(ranks.begin(), ranks.end(), rank);
}

// The undecided tensor `rank` waits for as `key`, or null when the wait can
// still end: the tensor was decided, or this rank has not submitted it (a
// report older than a resubmission of the same name).
const UndecidedTensor* Undecided(const std::map<WaitKey, UndecidedTensor>& undecided, int rank,
                                 const WaitKey& key) {
  auto it = undecided.find(key);
  if (it == undecided.end() || !Has(it->second.submitted, rank)) return nullptr;
  return &it->second;
}

// True when some member that must still submit the tensor is in `stuck`.
bool CannotComplete(const UndecidedTensor& t, const std::set<int>& stuck) {
  for (int m : t.missing) {
    if (stuck.count(m)) return true;
  }
  return false;
}

// The first tensor of `caller` that cannot complete, or null.
const WaitKey* DeadWait(const std::map<WaitKey, UndecidedTensor>& undecided, int rank,
                        const std::vector<WaitKey>& caller, const std::set<int>& stuck) {
  for (const WaitKey& key : caller) {
    const UndecidedTensor* t = Undecided(undecided, rank, key);
    if (t && CannotComplete(*t, stuck)) return &key;
  }
  return nullptr;
}

std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

std::string Describe(const WaitKey& key, const UndecidedTensor& t) {
  std::ostringstream os;
  if (t.type == OpType::kRecv) {
    os << "recv of tensor '" << key.name << "' from rank " << key.p2p_src;
    if (key.process_set != 0) os << " (rank " << t.src_in_set << " of process set " << key.process_set << ")";
    os << " with tag " << key.tag << " in "
       << (key.process_set == 0 ? "the global process set (0)" : "that set") << ", whose matching send rank "
       << key.p2p_src << " has not posted (it is blocked itself)";
    return os.str();
  }
  if (t.type == OpType::kBarrier) {
    os << "a barrier";
  } else {
    os << OpTypeName(t.type) << " '" << key.name << "'";
  }
  if (key.process_set != 0) os << " of process set " << key.process_set;
  os << " (submitted by ranks " << RankList(t.submitted) << ")";
  return os.str();
}

}  // namespace

void AddReceives(const std::map<int, RankWaits>& waits,
                 const std::function<std::vector<int>(int32_t)>& members,
                 std::map<WaitKey, UndecidedTensor>* undecided) {
  for (const auto& kv : waits) {
    for (const auto& caller : kv.second) {
      for (const WaitKey& key : caller) {
        if (key.p2p_src < 0) continue;
        UndecidedTensor& t = (*undecided)[key];
        if (t.type != OpType::kRecv) {
          t.type = OpType::kRecv;
          t.missing = {key.p2p_src};
          const std::vector<int> ranks = members(key.process_set);
          t.src_in_set =
              static_cast<int32_t>(std::lower_bound(ranks.begin(), ranks.end(), key.p2p_src) - ranks.begin());
        }
        auto pos = std::lower_bound(t.submitted.begin(), t.submitted.end(), kv.first);
        if (pos == t.submitted.end() || *pos != kv.first) t.submitted.insert(pos, kv.first);
      }
    }
  }
}

bool FindDeadlock(const std::map<int, RankWaits>& waits, const std::map<WaitKey, UndecidedTensor>& undecided,
                  DeadlockReport* out) {
  // Greatest fixed point: start from every blocked rank and drop those with a
  // caller whose tensors may all still complete.
  std::set<int> stuck;
  for (const auto& kv : waits) {
    if (!kv.second.empty()) stuck.insert(kv.first);
  }
  for (bool changed = true; changed && !stuck.empty();) {
    changed = false;
    for (auto it = stuck.begin(); it != stuck.end();) {
      bool blocked = true;
      for (const auto& caller : waits.at(*it)) blocked = blocked && DeadWait(undecided, *it, caller, stuck);
      if (blocked) {
        ++it;
      } else {
        it = stuck.erase(it);
        changed = true;
      }
    }
  }
  if (stuck.empty()) return false;
  constexpr size_t kMaxListed = 8;  // a message must stay readable at any scale
  std::set<WaitKey> fail;
  std::ostringstream os;
  os << "deadlock: ";
  size_t listed = 0;
  for (int rank : stuck) {
    for (const auto& caller : waits.at(rank)) {
      for (const WaitKey& key : caller) {
        const UndecidedTensor* t = Undecided(undecided, rank, key);
        if (t && CannotComplete(*t, stuck)) fail.insert(key);
      }
    }
    if (listed++ < kMaxListed) {
      const WaitKey* key = DeadWait(undecided, rank, waits.at(rank).front(), stuck);
      os << "rank " << rank << " waits in " << Describe(*key, undecided.at(*key)) << "; ";
    }
  }
  if (listed > kMaxListed) os << "... (" << listed - kMaxListed << " more ranks); ";
  os << "no operation can complete. Fix: make every rank submit the same collectives (same names, "
        "same process sets) before waiting for them";
  if (std::any_of(fail.begin(), fail.end(), [](const WaitKey& k) { return k.p2p_src >= 0; })) {
    os << ", and post every send a peer waits for (same tag, same process set) before blocking in a "
          "recv or collective that needs that peer first (send_async, or batch_isend_irecv for an exchange)";
  }
  out->ranks.assign(stuck.begin(), stuck.end());
  out->tensors.assign(fail.begin(), fail.end());
  out->message = os.str();
  return true;
}

std::string DescribeSubmissions(const std::vector<int>& ranks, const std::map<int, const Request*>& oldest) {
  constexpr size_t kMaxListed = 8;
  std::ostringstream os;
  for (size_t k = 0; k < ranks.size() && k < kMaxListed; ++k) {
    os << (k ? ", rank " : "rank ") << ranks[k];
    auto it = oldest.find(ranks[k]);
    if (it == oldest.end()) {
      os << " has submitted nothing";
      continue;
    }
    const Request& r = *it->second;
    os << (k ? " in " : " waits in ");
    if (r.type == OpType::kBarrier) {
      os << "a barrier";
    } else {
      os << OpTypeName(r.type) << " of '" << r.name << "'";
    }
  }
  if (ranks.size() > kMaxListed) os << ", ... (" << ranks.size() - kMaxListed << " more)";
  return os.str();
}

}  // namespace hvdlite
