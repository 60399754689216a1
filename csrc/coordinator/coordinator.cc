#include "coordinator/coordinator.h"

#include <algorithm>
#include <sstream>

#include "common/logging.h"
#include "coordinator/validation.h"

namespace hvdlite {
namespace {

int64_t TensorBytes(const Request& r) {
  int64_t n = 1;
  for (int64_t d : r.shape) n *= d;
  return n * static_cast<int64_t>(DataTypeSize(r.dtype));
}

std::string JoinRanks(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

// Allreduces fuse when set, dtype, op and both scales are equal: the key is
// those fields' bytes (exact for the doubles, and cheap to build).
std::string FusionKey(const Request& r) {
  struct {
    int32_t set, dtype, op, pad;
    double prescale, postscale;
  } k{r.process_set, static_cast<int32_t>(r.dtype), static_cast<int32_t>(r.op), 0, r.prescale, r.postscale};
  return std::string(reinterpret_cast<const char*>(&k), sizeof(k));
}

bool Cacheable(OpType t) {
  return t != OpType::kAddProcessSet && t != OpType::kRemoveProcessSet && t != OpType::kShutdown;
}

}  // namespace

Coordinator::Coordinator(const Config& cfg, ProcessSetTable* sets, int world_size)
    : cfg_(cfg), sets_(sets), world_size_(world_size),
      cache_(static_cast<size_t>(std::max<int64_t>(0, cfg.CACHE_CAPACITY))) {}

void Coordinator::Add(int rank, const RequestList& list) {
  for (const Request& in : list.requests) {
    Request r = in;
    r.rank = rank;
    if (r.cache_id >= 0) {
      if (!cache_.Expand(r.cache_id, rank, &r)) {
        HVD_LOG(kError, "rank " << rank << " sent unknown cache id " << r.cache_id << "; dropped");
        continue;
      }
      r.rank = rank;
    }
    AddOne(std::move(r));
  }
}

void Coordinator::AddOne(Request r) {
  if (r.type == OpType::kShutdown) {
    OnShutdown(r.rank);
    return;
  }
  std::vector<int> ranks = sets_->Ranks(r.process_set);
  if (ranks.empty()) {
    DecideError(r, {r.rank}, Status::InvalidArgument(
        std::string(OpTypeName(r.type)) + " of tensor '" + r.name + "': process set " +
        std::to_string(r.process_set) + " does not exist (was it removed, or not added on every rank?)"));
    return;
  }
  auto pos = std::lower_bound(ranks.begin(), ranks.end(), r.rank);
  if (pos == ranks.end() || *pos != r.rank) {
    DecideError(r, {r.rank}, Status::InvalidArgument(
        std::string(OpTypeName(r.type)) + " of tensor '" + r.name + "': rank " + std::to_string(r.rank) +
        " is not a member of process set " + std::to_string(r.process_set) + " (members: " + JoinRanks(ranks) + ")"));
    return;
  }
  for (int gone : shutdown_ranks_) {
    if (std::binary_search(ranks.begin(), ranks.end(), gone)) {
      DecideError(r, {r.rank}, Status::Aborted(
          std::string(OpTypeName(r.type)) + " of tensor '" + r.name + "' cannot run: rank " +
          std::to_string(gone) + " has shut down. Every rank must call shutdown() only after its last collective."));
      return;
    }
  }
  Key key{r.process_set, r.name};
  Pending& p = pending_[key];
  if (p.reqs.empty()) {
    p.reqs.resize(ranks.size());
    p.have.assign(ranks.size(), false);
    p.first_seen = p.last_warned = Clock::now();
  }
  int member = static_cast<int>(pos - ranks.begin());
  if (p.have[member]) {
    // The runtime refuses a second submission of a name in flight, so this is
    // only reachable through a protocol bug; keep the first.
    HVD_LOG(kError, "rank " << r.rank << " submitted tensor '" << r.name << "' twice");
    return;
  }
  p.reqs[member] = std::move(r);
  p.have[member] = true;
  if (++p.count == static_cast<int>(ranks.size())) {
    Decide(key, p);
    pending_.erase(key);
  }
}

void Coordinator::Decide(const Key& key, Pending& p) {
  std::vector<int> ranks = sets_->Ranks(key.first);
  const Request& r0 = p.reqs[0];
  Decided d;
  d.recipients = ranks;
  d.response.type = r0.type;
  d.response.process_set = r0.process_set;
  d.response.names.push_back(r0.name);
  Status st = ValidateRequests(p.reqs, ranks, &d.response.sizes);
  if (!st.ok()) {
    DecideError(r0, ranks, st);
    return;
  }
  if (r0.type == OpType::kAddProcessSet) {
    int32_t id = next_set_id_++;
    std::vector<int> members(r0.splits.begin(), r0.splits.end());
    sets_->Add(id, members);
    d.response.sizes = {id};
  } else if (r0.type == OpType::kRemoveProcessSet) {
    sets_->Remove(r0.root);
  }
  d.response.cache_ids.push_back(Cacheable(r0.type) ? cache_.Bind(p.reqs) : -1);
  if (r0.type == OpType::kAllreduce) {
    d.fusion_key = FusionKey(r0);
    d.bytes = TensorBytes(r0);
  }
  decided_.push_back(std::move(d));
}

void Coordinator::DecideError(const Request& r, const std::vector<int>& recipients, const Status& st) {
  Decided d;
  d.recipients = recipients;
  d.response.type = r.type;
  d.response.process_set = r.process_set;
  d.response.names.push_back(r.name);
  d.response.cache_ids.push_back(-1);
  d.response.error_code = st.code();
  d.response.error = st.message();
  decided_.push_back(std::move(d));
}

// A rank that shuts down can no longer take part in collectives: every
// undecided tensor of a set that contains it fails on every member.
void Coordinator::OnShutdown(int rank) {
  shutdown_ranks_.insert(rank);
  for (auto it = pending_.begin(); it != pending_.end();) {
    std::vector<int> ranks = sets_->Ranks(it->first.first);
    if (!std::binary_search(ranks.begin(), ranks.end(), rank)) { ++it; continue; }
    Request any;
    for (size_t i = 0; i < ranks.size(); ++i) if (it->second.have[i]) { any = it->second.reqs[i]; break; }
    DecideError(any, ranks, Status::Aborted(
        std::string(OpTypeName(any.type)) + " of tensor '" + any.name + "' cannot run: rank " +
        std::to_string(rank) + " has shut down before submitting it."));
    it = pending_.erase(it);
  }
}

// Greedy, order-preserving fusion: an allreduce joins the most recent response
// with the same fusion key (same set, dtype, op, scales: so the same
// recipients) if the combined size stays within the threshold.
void Coordinator::FuseInto(std::vector<Decided>* out) {
  std::map<std::string, std::pair<size_t, int64_t>> open;  // key -> (index in out, bytes)
  for (auto& d : decided_) {
    if (!d.fusion_key.empty() && d.response.error_code == StatusCode::kOk) {
      auto it = open.find(d.fusion_key);
      if (it != open.end() && it->second.second + d.bytes <= cfg_.FUSION_THRESHOLD) {
        Response& target = (*out)[it->second.first].response;
        target.names.push_back(d.response.names[0]);
        target.cache_ids.push_back(d.response.cache_ids[0]);
        it->second.second += d.bytes;
        continue;
      }
      open[d.fusion_key] = {out->size(), d.bytes};
    }
    out->push_back(std::move(d));
  }
  decided_.clear();
}

bool Coordinator::Drain(std::vector<ResponseList>* per_rank) {
  per_rank->assign(world_size_, ResponseList{});
  bool announce = AllRanksShutDown() && !shutdown_announced_;
  if (decided_.empty() && !announce) return false;
  std::vector<Decided> fused;
  FuseInto(&fused);
  for (auto& d : fused) {
    for (int rank : d.recipients) (*per_rank)[rank].responses.push_back(d.response);
  }
  if (announce) {
    shutdown_announced_ = true;
    for (auto& l : *per_rank) l.shutdown = true;
  }
  return true;
}

int Coordinator::CheckStalls() {
  if (cfg_.STALL_CHECK_DISABLE || pending_.empty()) return 1000;
  const auto now = Clock::now();
  const auto warn_after = std::chrono::duration<double>(cfg_.STALL_CHECK_TIME_SECONDS);
  const auto fail_after = std::chrono::duration<double>(cfg_.STALL_SHUTDOWN_TIME_SECONDS);
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    std::vector<int> ranks = sets_->Ranks(it->first.first), missing, ready;
    for (size_t i = 0; i < ranks.size(); ++i) (p.have[i] ? ready : missing).push_back(ranks[i]);
    const double waited = std::chrono::duration<double>(now - p.first_seen).count();
    if (cfg_.STALL_SHUTDOWN_TIME_SECONDS > 0 && now - p.first_seen >= fail_after) {
      std::ostringstream os;
      os << "tensor '" << it->first.second << "' stalled for " << static_cast<int>(waited)
         << " s: ranks " << JoinRanks(missing) << " never submitted it (ranks " << JoinRanks(ready)
         << " did). Make every rank run the same collectives, or raise HVDLITE_STALL_SHUTDOWN_TIME_SECONDS.";
      const Request& any = p.reqs[std::find(p.have.begin(), p.have.end(), true) - p.have.begin()];
      DecideError(any, ranks, Status::Timeout(os.str()));
      it = pending_.erase(it);
      continue;
    }
    if (now - p.last_warned >= warn_after) {
      p.last_warned = now;
      HVD_LOG(kWarning, "Stalled tensor '" << it->first.second << "' (process set " << it->first.first
              << "): waiting " << static_cast<int>(waited) << " s for ranks " << JoinRanks(missing)
              << " to submit it; ranks " << JoinRanks(ready) << " are ready. One or more ranks may have "
              << "diverged (different collectives or names) or be stuck.");
    }
    ++it;
  }
  return static_cast<int>(std::min(1000.0, std::max(10.0, cfg_.STALL_CHECK_TIME_SECONDS * 1000 / 4)));
}

}  // namespace hvdlite
