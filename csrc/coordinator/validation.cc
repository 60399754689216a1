#include "coordinator/validation.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>

namespace hvdlite {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::string RanksStr(const std::vector<int>& r) {
  std::ostringstream os;
  os << (r.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < r.size(); ++i) os << (i ? ", " : "") << r[i];
  return os.str();
}

// If `key(req)` differs across members, returns a Mismatch that groups the
// ranks by value: "... for tensor 'w': rank 0 has X; ranks 1, 2 have Y. <fix>".
Status CheckAgree(const std::vector<Request>& reqs, const std::vector<int>& ranks, const char* what,
                  const std::function<std::string(const Request&)>& key, const char* fix) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::string k = key(reqs[i]);
    if (!groups.count(k)) order.push_back(k);
    groups[k].push_back(ranks[i]);
  }
  if (groups.size() <= 1) return Status::OK();
  std::ostringstream os;
  os << "Mismatched " << what << " for " << OpTypeName(reqs[0].type) << " of tensor '" << reqs[0].name
     << "': ";
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& rs = groups[order[i]];
    os << (i ? "; " : "") << RanksStr(rs) << (rs.size() == 1 ? " has " : " have ") << order[i];
  }
  os << ". " << fix;
  return Status::Mismatch(os.str());
}

std::string TailShape(const Request& r) {
  std::vector<int64_t> tail(r.shape.size() > 1 ? r.shape.begin() + 1 : r.shape.end(), r.shape.end());
  return std::to_string(r.shape.size()) + "-d, trailing dims " + ShapeStr(tail);
}

Status CheckAlltoallSplits(const std::vector<Request>& reqs, const std::vector<int>& ranks,
                           std::vector<int64_t>* sizes) {
  const size_t n = reqs.size();
  sizes->assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Request& r = reqs[i];
    int64_t rows = r.shape.empty() ? 0 : r.shape[0];
    if (r.splits.empty()) {
      if (rows % static_cast<int64_t>(n) != 0) {
        return Status::InvalidArgument(
            "alltoall of tensor '" + r.name + "' on rank " + std::to_string(ranks[i]) + ": first dimension " +
            std::to_string(rows) + " is not divisible by the process set size " + std::to_string(n) +
            "; pass splits= to say how many rows go to each rank");
      }
      for (size_t j = 0; j < n; ++j) (*sizes)[i * n + j] = rows / static_cast<int64_t>(n);
      continue;
    }
    int64_t total = 0;
    bool negative = false;
    for (int64_t s : r.splits) {
      total += s;
      negative |= s < 0;
    }
    if (r.splits.size() != n || negative || total != rows) {
      return Status::InvalidArgument("alltoall of tensor '" + r.name + "' on rank " +
                                     std::to_string(ranks[i]) + ": splits " + ShapeStr(r.splits) +
                                     " must have one non-negative entry per rank (" + std::to_string(n) +
                                     ") summing to the first dimension " + std::to_string(rows));
    }
    for (size_t j = 0; j < n; ++j) (*sizes)[i * n + j] = r.splits[j];
  }
  return Status::OK();
}

Status CheckReduction(const Request& r) {
  if (r.op == ReduceOp::kAdasum) {
    return Status::NotSupported("Adasum is not supported by the hvdlite core for tensor '" + r.name +
                                "'; use op=Sum or op=Average");
  }
  if (r.dtype == DataType::kBool) {
    return Status::NotSupported(std::string(OpTypeName(r.type)) + " of tensor '" + r.name +
                                "': bool tensors cannot be reduced; cast to uint8 or int32 first");
  }
  return Status::OK();
}

}  // namespace

Status ValidateRequests(const std::vector<Request>& reqs, const std::vector<int>& ranks, Response* out) {
  out->first_dims.clear();
  out->split_matrix.clear();
  const char* same = "Every rank must submit it with the same value under the same name.";
  // Fast path (steady state): identical submissions agree on every key, so
  // skip building the keys, which exist only to word a mismatch.
  bool uniform = true;
  for (const Request& r : reqs) uniform = uniform && r.SameSignature(reqs[0]);
  auto agree = [&](const char* what, const std::function<std::string(const Request&)>& key, const char* fix) {
    return uniform ? Status::OK() : CheckAgree(reqs, ranks, what, key, fix);
  };
  HVD_RETURN_IF_ERROR(agree(
      "operations", [](const Request& r) { return std::string(OpTypeName(r.type)); },
      "A tensor name must refer to the same collective on every rank."));
  HVD_RETURN_IF_ERROR(agree(
      "dtypes", [](const Request& r) { return std::string(DataTypeName(r.dtype)); },
      "Cast the tensor to one dtype on every rank."));
  HVD_RETURN_IF_ERROR(CheckAgree(
      reqs, ranks, "devices",
      [](const Request& r) { return std::string(r.device < 0 ? "a CPU tensor" : "a CUDA tensor"); },
      "Every rank must pass a CPU tensor, or every rank a CUDA tensor, under the same name."));
  const Request& r0 = reqs[0];
  switch (r0.type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      HVD_RETURN_IF_ERROR(agree("shapes", [](const Request& r) { return ShapeStr(r.shape); }, same));
      HVD_RETURN_IF_ERROR(
          agree("reduce ops", [](const Request& r) { return std::string(ReduceOpName(r.op)); }, same));
      HVD_RETURN_IF_ERROR(agree(
          "scale factors",
          [](const Request& r) {
            char buf[96];  // %.17g: distinct doubles never print alike
            std::snprintf(buf, sizeof(buf), "prescale %.17g postscale %.17g", r.prescale, r.postscale);
            return std::string(buf);
          },
          same));
      HVD_RETURN_IF_ERROR(CheckReduction(r0));
      break;
    case OpType::kAllgather:
      HVD_RETURN_IF_ERROR(
          agree("shapes", TailShape, "Allgather tensors may differ only in their first dimension."));
      for (const auto& r : reqs) out->first_dims.push_back(r.shape.empty() ? 1 : r.shape[0]);
      break;
    case OpType::kBroadcast: {
      HVD_RETURN_IF_ERROR(agree("shapes", [](const Request& r) { return ShapeStr(r.shape); }, same));
      HVD_RETURN_IF_ERROR(agree("root ranks", [](const Request& r) { return std::to_string(r.root); }, same));
      bool member = false;
      for (int rk : ranks) member |= (rk == r0.root);
      if (!member) {
        return Status::InvalidArgument(
            "broadcast of tensor '" + r0.name + "': root rank " + std::to_string(r0.root) +
            " is not a member of the process set; pick a root among " + RanksStr(ranks));
      }
      break;
    }
    case OpType::kAlltoall:
      HVD_RETURN_IF_ERROR(
          agree("shapes", TailShape, "Alltoall tensors may differ only in their first dimension."));
      HVD_RETURN_IF_ERROR(CheckAlltoallSplits(reqs, ranks, &out->split_matrix));
      break;
    case OpType::kAddProcessSet:
      HVD_RETURN_IF_ERROR(agree(
          "process set ranks",
          [](const Request& r) {
            return ShapeStr(std::vector<int64_t>(r.set_members.begin(), r.set_members.end()));
          },
          "Every rank must call add_process_set with the same ranks, in the same order of calls."));
      break;
    case OpType::kRemoveProcessSet:
      HVD_RETURN_IF_ERROR(agree(
          "process set ids", [](const Request& r) { return std::to_string(r.target_set); },
          "Every rank must remove the same process sets in the same order."));
      break;
    case OpType::kBarrier:
    case OpType::kJoin:
    case OpType::kShutdown:
    case OpType::kRecv:  // never negotiated (c_api refuses it)
      break;
  }
  return Status::OK();
}

// Horovod's rule: only allreduce (and barrier) run while members have joined;
// the data collectives fail on every member that submitted them.
Status CheckJoinedParticipation(const Request& r0, const std::vector<int>& joined) {
  std::string who;
  for (int r : joined) who += (who.empty() ? "" : ", ") + std::to_string(r);
  if (r0.type == OpType::kAlltoall || r0.type == OpType::kReducescatter || r0.type == OpType::kAllgather ||
      r0.type == OpType::kBroadcast) {
    return Status::NotSupported(std::string(OpTypeName(r0.type)) + " of tensor '" + r0.name +
                                "' cannot run while ranks " + who +
                                " have joined; only allreduce and barrier can (as in Horovod). "
                                "Call it before join().");
  }
  return Status::OK();
}

std::string JoinRanks(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

Status CheckSubmission(const Request& r, const std::vector<int>& members, const std::set<int>& shut_down) {
  const std::string what = std::string(OpTypeName(r.type)) + " of tensor '" + r.name + "'";
  if (members.empty()) {
    return Status::InvalidArgument(what + ": process set " + std::to_string(r.process_set) +
                                   " does not exist (was it removed, or not added on every rank?)");
  }
  if (!std::binary_search(members.begin(), members.end(), r.rank)) {
    return Status::InvalidArgument(what + ": rank " + std::to_string(r.rank) +
                                   " is not a member of process set " + std::to_string(r.process_set) +
                                   " (members: " + JoinRanks(members) + ")");
  }
  for (int gone : shut_down) {
    if (std::binary_search(members.begin(), members.end(), gone)) {
      return Status::Aborted(
          what + " cannot run: rank " + std::to_string(gone) +
          " has shut down. Every rank must call shutdown() only after its last collective.");
    }
  }
  return Status::OK();
}

}  // namespace hvdlite
