#include "runtime/tensor_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

namespace hvdlite {

TensorQueue::TensorQueue() { wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

TensorQueue::~TensorQueue() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

Status TensorQueue::Push(TensorEntry entry) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(entry.request.process_set, entry.request.name);
    if (entry.request.type != OpType::kShutdown && in_flight_.count(key)) {
      return Status::Precondition("a tensor named '" + entry.request.name +
                                  "' is already in flight; wait for it (synchronize) or give each "
                                  "concurrent operation a unique name");
    }
    fresh_.push_back(entry.request);
    if (entry.request.type != OpType::kShutdown) in_flight_.emplace(key, Slot{std::move(entry), false});
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

void TensorQueue::TakeNew(std::vector<Request>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  taken_ = pushed_.load(std::memory_order_relaxed);
  out->swap(fresh_);
  fresh_.clear();
}

void TensorQueue::SetSleeping(bool sleeping) {
  sleeping_.store(sleeping, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // before the caller's HasNew() re-check
}

bool TensorQueue::Pop(int32_t process_set, const std::string& name, TensorEntry* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find({process_set, name});
  if (it == in_flight_.end() || it->second.executing) return false;
  *out = std::move(it->second.entry);
  it->second.executing = true;
  return true;
}

void TensorQueue::Finish(int32_t process_set, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find({process_set, name});
  if (it != in_flight_.end() && it->second.executing) in_flight_.erase(it);
}

std::vector<TensorEntry> TensorQueue::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TensorEntry> all;
  for (auto& kv : in_flight_) {
    if (!kv.second.executing) all.push_back(std::move(kv.second.entry));
  }
  in_flight_.clear();
  fresh_.clear();
  return all;
}

void TensorQueue::ClearWake() {
  uint64_t v;
  ssize_t n = read(wake_fd_, &v, sizeof(v));
  (void)n;
}

}  // namespace hvdlite
