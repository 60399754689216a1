#include "runtime/tensor_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

namespace hvdlite {
namespace {
std::atomic<int64_t> g_next_wait_token{1};  // unique across runtimes: a token may outlive its runtime
}  // namespace

TensorQueue::TensorQueue() { wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

TensorQueue::~TensorQueue() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

Status TensorQueue::Push(TensorEntry entry) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (entry.request.type != OpType::kShutdown) {
      const int32_t set = entry.request.process_set;
      const std::string& name = entry.request.name;
      const auto after = in_flight_.lower_bound(View(set, name));
      if (after != in_flight_.end() && !KeyLess()(View(set, name), after->first)) {
        return Status::Precondition("a tensor named '" + name +
                                    "' is already in flight; wait for it (synchronize) or give each "
                                    "concurrent operation a unique name");
      }
      auto placed = in_flight_pool_.Insert(&in_flight_, after, [&](Key& key) {
        key.first = set;
        key.second.assign(name);
      });
      fresh_.push_back(entry.request);
      const int64_t handle = entry.handle;
      by_handle_pool_.Insert(&by_handle_, [handle](int64_t& key) { key = handle; })->second = &placed->first;
      placed->second.entry = std::move(entry);
      placed->second.executing = false;
    } else {
      fresh_.push_back(entry.request);
    }
    pushed_.fetch_add(1, std::memory_order_seq_cst);
  }
  Kick();
  return Status::OK();
}

void TensorQueue::Kick() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }
}

void TensorQueue::TakeNew(std::vector<Request>* out, RankWaits* waits, bool* waits_changed) {
  std::lock_guard<std::mutex> lock(mu_);
  taken_ = pushed_.load(std::memory_order_relaxed);
  out->swap(fresh_);
  fresh_.clear();
  if (!waits) return;
  if (waiters_.empty() && reported_.empty()) {  // the common case, without a clock read
    *waits_changed = false;
    return;
  }
  const Clock::time_point due = Clock::now() - kWaitReportDelay;
  std::vector<int64_t> now_blocked;
  if (!p2p_sending_.load(std::memory_order_relaxed)) {
    for (const auto& kv : waiters_) {
      if (kv.second.since <= due && StillBlocked(kv.second)) now_blocked.push_back(kv.first);
    }
  }
  *waits_changed = now_blocked != reported_;
  if (!*waits_changed) return;
  waits->clear();
  for (int64_t token : now_blocked) waits->push_back(waiters_[token].keys);
  reported_.swap(now_blocked);
}

int64_t TensorQueue::BeginWait(const std::vector<int64_t>& handles) {
  Waiter w;
  w.since = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t h : handles) {
    auto it = by_handle_.find(h);
    if (it != by_handle_.end()) {
      w.keys.push_back(WaitKey{it->second->first, it->second->second});
      continue;
    }
    auto recv = p2p_recvs_.find(h);
    if (recv != p2p_recvs_.end()) {
      w.keys.push_back(recv->second);
      w.p2p_handles.push_back(h);
    }
  }
  if (w.keys.empty()) return 0;
  const int64_t token = g_next_wait_token.fetch_add(1);
  waiters_.emplace(token, std::move(w));
  return token;
}

// A caller whose receive has completed is about to wake: not reported.
bool TensorQueue::StillBlocked(const Waiter& w) const {
  for (int64_t h : w.p2p_handles) {
    if (p2p_recvs_.count(h) == 0) return false;
  }
  return true;
}

void TensorQueue::AddP2pRecv(int64_t handle, WaitKey key) {
  std::lock_guard<std::mutex> lock(mu_);
  p2p_recvs_.emplace(handle, std::move(key));
}

void TensorQueue::EndP2pRecv(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  p2p_recvs_.erase(handle);
}

void TensorQueue::EndWait(int64_t token) {
  bool reported = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiters_.erase(token) == 0) return;
    reported = std::find(reported_.begin(), reported_.end(), token) != reported_.end();
    if (reported) pushed_.fetch_add(1, std::memory_order_seq_cst);  // the engine reports the change
  }
  if (reported) Kick();
}

int TensorQueue::MsUntilWaitReport() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (waiters_.empty()) return 1000;
  const Clock::time_point now = Clock::now();
  long long ms = 1000;
  for (const auto& kv : waiters_) {
    if (std::find(reported_.begin(), reported_.end(), kv.first) != reported_.end()) continue;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(kv.second.since + kWaitReportDelay - now);
    ms = std::min<long long>(ms, std::max<long long>(0, left.count() + 1));
  }
  return static_cast<int>(ms);
}

void TensorQueue::SetSleeping(bool sleeping) {
  sleeping_.store(sleeping, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // before the caller's HasNew() re-check
}

size_t TensorQueue::TakenWaiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t waiting = 0, fresh = 0;
  for (const auto& kv : in_flight_) waiting += kv.second.executing ? 0 : 1;
  for (const Request& r : fresh_) fresh += r.type == OpType::kShutdown ? 0 : 1;
  return waiting - std::min(waiting, fresh);
}

bool TensorQueue::CallerBlocked() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : waiters_) {
    for (const WaitKey& k : kv.second.keys) {
      auto it = in_flight_.find(View(k.process_set, k.name));
      if (it != in_flight_.end() && !it->second.executing) return true;
    }
  }
  return false;
}

const TensorEntry* TensorQueue::Find(int32_t process_set, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find(View(process_set, name));
  return it == in_flight_.end() || it->second.executing ? nullptr : &it->second.entry;
}

bool TensorQueue::Pop(int32_t process_set, const std::string& name, TensorEntry* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find(View(process_set, name));
  if (it == in_flight_.end() || it->second.executing) return false;
  auto indexed = by_handle_.find(it->second.entry.handle);
  if (indexed != by_handle_.end()) by_handle_pool_.Erase(&by_handle_, indexed);
  *out = std::move(it->second.entry);
  it->second.executing = true;
  return true;
}

void TensorQueue::Finish(int32_t process_set, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find(View(process_set, name));
  if (it != in_flight_.end() && it->second.executing) in_flight_pool_.Erase(&in_flight_, it);
}

std::vector<TensorEntry> TensorQueue::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TensorEntry> all;
  for (auto& kv : in_flight_) {
    if (!kv.second.executing) all.push_back(std::move(kv.second.entry));
  }
  in_flight_.clear();
  by_handle_.clear();
  fresh_.clear();
  return all;
}

void TensorQueue::ClearWake() {
  uint64_t v;
  ssize_t n = read(wake_fd_, &v, sizeof(v));
  (void)n;
}

}  // namespace hvdlite
