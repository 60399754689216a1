#include "backend/cuda/nccl_comm.h"

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include <cuda_runtime_api.h>

#include "rendezvous/store.h"

namespace hvdlite {
namespace cuda {
namespace {

constexpr int kPollMs = 1;  // between ncclCommGetAsyncError polls

std::string ArrivalKey(const std::string& key, int member) {
  return key + "/arrived/" + std::to_string(member);
}

std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

// The Timeout of a set-up that did not finish: names the ranks that never arrived.
Status SetupTimeout(const CommSetup& s, const std::string& stage) {
  std::vector<int> missing = MissingRanks(s.store, s.key, s.ranks);
  std::ostringstream os;
  os << "NCCL communicator set-up for " << s.what << " (ranks " << RankList(s.ranks)
     << ") did not finish within " << s.timeout_s << " s (HVDLITE_START_TIMEOUT) while " << stage << ": ";
  if (!missing.empty()) {
    os << "rank" << (missing.size() > 1 ? "s " : " ") << RankList(missing)
       << " never arrived (crashed, hung, or did not run the same CUDA collective)";
  } else {
    os << "every rank arrived but NCCL did not connect them (check the network; NCCL_DEBUG=INFO says more)";
  }
  return Status::Timeout(os.str());
}

// A failed ncclCommInitRankConfig, with NCCL's own reason (ncclGetLastError) and the usual
// cause of "invalid usage" at set-up: two members on one GPU, which NCCL refuses.
Status InitFailure(const CommSetup& s, ncclComm_t comm, ncclResult_t r, const Status& st) {
  std::ostringstream os;
  os << "NCCL communicator set-up for " << s.what << " (ranks " << RankList(s.ranks)
     << ") failed: " << st.message();
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') os << " (NCCL: " << last << ")";
  if (r == ncclInvalidUsage) {
    int device = -1;
    cudaGetDevice(&device);
    os << ". This rank uses CUDA device " << device
       << "; NCCL refuses two members on one GPU, so each rank of a CUDA collective needs its own: call "
          "torch.cuda.set_device(hvd.local_rank()) (or give each rank its own CUDA_VISIBLE_DEVICES)";
  }
  os << ". NCCL_DEBUG=WARN shows NCCL's log";
  return Status::Internal(os.str());
}

// Member 0 creates and publishes the unique id; the others wait for it.
Status ExchangeId(const CommSetup& s, const Deadline& deadline, ncclUniqueId* id) {
  const std::string key = s.key + "/id";
  if (s.me == 0) {
    ncclResult_t r = ncclGetUniqueId(id);
    if (r != ncclSuccess)
      return Status::Internal(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    return s.store->Set(key, std::string(reinterpret_cast<const char*>(id), sizeof(*id)));
  }
  std::string value;
  Status st = s.store->Get(key, deadline.RemainingMs() / 1000.0, &value);
  if (st.code() == StatusCode::kTimeout)
    return SetupTimeout(s, "waiting for rank " + std::to_string(s.ranks[0]) + "'s NCCL id");
  HVD_RETURN_IF_ERROR(st);
  if (value.size() != sizeof(*id)) return Status::Internal("malformed NCCL unique id in the store at " + key);
  std::memcpy(id, value.data(), sizeof(*id));
  return Status::OK();
}

}  // namespace

std::vector<int> MissingRanks(Store* store, const std::string& key, const std::vector<int>& ranks) {
  std::vector<int> missing;
  std::string value;
  for (size_t m = 0; m < ranks.size(); ++m) {
    if (!store->Get(ArrivalKey(key, static_cast<int>(m)), 0, &value).ok()) missing.push_back(ranks[m]);
  }
  return missing;
}

Status SettleNccl(ncclComm_t comm, ncclResult_t r, const char* what, const Deadline& deadline,
                  ncclResult_t* final_result) {
  while (r == ncclInProgress) {
    if (deadline.expired()) return Status::Timeout(std::string(what) + " did not complete in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
    ncclResult_t poll = ncclCommGetAsyncError(comm, &r);
    if (poll != ncclSuccess) r = poll;
  }
  if (final_result != nullptr) *final_result = r;
  if (r != ncclSuccess) return Status::Internal(std::string(what) + " failed: " + ncclGetErrorString(r));
  return Status::OK();
}

Status InitNcclComm(const CommSetup& s, ncclComm_t* out) {
  *out = nullptr;
  if (s.store == nullptr) return Status::Internal("NCCL set-up without a store");
  const Deadline deadline = Deadline::After(s.timeout_s);
  HVD_RETURN_IF_ERROR(s.store->Set(ArrivalKey(s.key, s.me), "1"));
  ncclUniqueId id{};
  HVD_RETURN_IF_ERROR(ExchangeId(s, deadline, &id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init returns at once; progress is polled below, against the deadline
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, static_cast<int>(s.ranks.size()), id, s.me, &config);
  if (comm == nullptr) {
    return Status::Internal(std::string("ncclCommInitRankConfig failed: ") + ncclGetErrorString(r));
  }
  Status st = SettleNccl(comm, r, "ncclCommInitRankConfig", deadline, &r);
  if (st.code() == StatusCode::kTimeout) st = SetupTimeout(s, "connecting the communicator");
  if (!st.ok() && st.code() != StatusCode::kTimeout) st = InitFailure(s, comm, r, st);
  if (!st.ok()) {
    ncclCommAbort(comm);  // frees it; never waits for the missing peers
    return st;
  }
  *out = comm;
  return Status::OK();
}

}  // namespace cuda
}  // namespace hvdlite
