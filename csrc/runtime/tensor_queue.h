// TensorQueue: operations the caller submitted and the background thread has
// not finished yet.
//
// Push() (any caller thread) records the entry under its name and wakes the
// background thread through an eventfd; TakeNew() (background thread) returns
// the requests not yet sent to the coordinator; Pop() removes an entry when
// its response arrives. A name may be in flight once per process set.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/messages.h"

namespace hvdlite {

struct TensorEntry {
  Request request;
  void* data = nullptr;  // caller's buffer; valid until the handle completes
  void* stream = nullptr;  // CUDA tensors: the framework's stream the data is ready on (null = default)
  int64_t handle = 0;
};

class TensorQueue {
 public:
  TensorQueue();
  ~TensorQueue();
  int wake_fd() const { return wake_fd_; }
  // Precondition error when the name is already in flight in that set.
  Status Push(TensorEntry entry);
  void TakeNew(std::vector<Request>* out);
  bool Pop(int32_t process_set, const std::string& name, TensorEntry* out);
  // Removes and returns every entry (to fail them).
  std::vector<TensorEntry> TakeAll();
  // Clears the eventfd after a wake-up.
  void ClearWake();

 private:
  std::mutex mu_;
  std::map<std::pair<int32_t, std::string>, TensorEntry> in_flight_;
  std::vector<Request> fresh_;
  int wake_fd_ = -1;
};

}  // namespace hvdlite
