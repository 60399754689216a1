#include "runtime/handles.h"

#include <chrono>
#include <cstdlib>

namespace hvdlite {

int64_t HandleTable::Create() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t h = next_++;
  pool_.Insert(&states_, [h](int64_t& key) { key = h; })->second = State{};
  return h;
}

void HandleTable::Complete(int64_t handle, HandleResult result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = states_.find(handle);
    if (it == states_.end() || it->second.done) {
      FreeOutput(result.output);
      return;
    }
    it->second.done = true;
    it->second.result = std::move(result);
    completions_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
}

void HandleTable::FailAll(const Status& st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : states_) {
      if (!kv.second.done) {
        kv.second.done = true;
        kv.second.result.status = st;
      }
    }
    completions_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
}

int HandleTable::Poll(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  if (it == states_.end()) return -1;
  return it->second.done ? 1 : 0;
}

bool HandleTable::Done(int64_t handle, Status* status, bool* known) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  *known = it != states_.end();
  if (!*known || !it->second.done) return false;
  *status = it->second.result.status;
  return true;
}

Status HandleTable::Wait(int64_t handle, double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto until =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
  while (true) {
    auto it = states_.find(handle);
    if (it == states_.end()) return Status::InvalidArgument("unknown handle " + std::to_string(handle));
    if (it->second.done) return it->second.result.status;
    if (cv_.wait_until(lock, until) == std::cv_status::timeout) {
      auto again = states_.find(handle);
      if (again != states_.end() && again->second.done) return again->second.result.status;
      return Status::Timeout("operation still in progress");
    }
  }
}

bool HandleTable::Take(int64_t handle, HandleResult* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  if (it == states_.end() || !it->second.done) return false;
  *out = std::move(it->second.result);
  it->second = State{};
  pool_.Erase(&states_, it);
  return true;
}

void HandleTable::Release(int64_t handle) {
  void* orphan = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = states_.find(handle);
    if (it == states_.end()) return;
    orphan = it->second.result.output;
    it->second = State{};
    pool_.Erase(&states_, it);
  }
  FreeOutput(orphan);
}

}  // namespace hvdlite
