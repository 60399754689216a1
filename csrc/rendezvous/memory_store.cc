// MemoryStore: an in-process Store (size-1 jobs, tests with ranks as threads).
// Counters written by Add() are stored as decimal strings, as in TcpStore.
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "rendezvous/store.h"
#include "rendezvous/store_util.h"

namespace hvdlite {
namespace {

class MemoryStore : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
    return Status::OK();
  }

  Status Get(const std::string& key, double timeout_s, std::string* value) override {
    auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0));
    std::unique_lock<std::mutex> lock(mu_);
    bool found = cv_.wait_until(lock, deadline, [&] { return data_.count(key) > 0; });
    if (!found) return StoreGetTimeout(key, timeout_s);
    *value = data_[key];
    return Status::OK();
  }

  Status Add(const std::string& key, int64_t delta, int64_t* result) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !ParseStoreCounter(it->second, &current)) {
        return Status::InvalidArgument("store key '" + key +
                                       "' holds a non-integer value; Add() needs a counter");
      }
      current += delta;
      data_[key] = std::to_string(current);
      if (result != nullptr) *result = current;
    }
    cv_.notify_all();
    return Status::OK();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore() { return std::unique_ptr<Store>(new MemoryStore()); }

}  // namespace hvdlite
