// TensorQueue: operations the caller submitted and the background thread has
// not finished yet.
//
// Push() (any caller thread) records the entry under its name and makes it
// visible to the background thread: through an atomic counter the thread
// polls while it spins, and through an eventfd only when the thread has said
// it is going to sleep (SetSleeping), so a spinning thread costs the caller
// no syscall. TakeNew() (engine) returns the requests not yet sent to the
// coordinator; Pop() hands an entry to the executor when its response
// arrives, and Finish() ends it once its handle is completed. A name may be in
// flight (pushed and not finished) once per process set.
#pragma once
#include <atomic>
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
  void* data = nullptr;    // caller's buffer; valid until the handle completes
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
  // Moves the entry out for execution; the name stays in flight until Finish.
  bool Pop(int32_t process_set, const std::string& name, TensorEntry* out);
  void Finish(int32_t process_set, const std::string& name);
  // Removes every entry and returns those not being executed (to fail them).
  std::vector<TensorEntry> TakeAll();
  // Clears the eventfd after a wake-up.
  void ClearWake();
  // Background thread: true when requests were pushed since the last TakeNew
  // (a relaxed read of one counter: cheap enough to poll).
  bool HasNew() const { return pushed_.load(std::memory_order_acquire) != taken_; }
  // Background thread, before (true) and after (false) a sleep on wake_fd().
  // After SetSleeping(true) check HasNew() once more before sleeping: a Push
  // either sees the flag (and writes the eventfd) or is seen by that check.
  void SetSleeping(bool sleeping);
  // Any thread: wakes the background thread if it sleeps on wake_fd() (after
  // the caller published, with a seq_cst write, what it should notice).
  void Kick();

 private:
  std::mutex mu_;
  struct Slot {
    TensorEntry entry;
    bool executing = false;  // moved out by Pop, not finished yet
  };
  std::map<std::pair<int32_t, std::string>, Slot> in_flight_;
  std::vector<Request> fresh_;
  int wake_fd_ = -1;
  std::atomic<uint64_t> pushed_{0};    // Push count
  uint64_t taken_ = 0;                 // pushed_ as of the last TakeNew (background thread)
  std::atomic<bool> sleeping_{false};  // the background thread may be asleep on wake_fd_
};

}  // namespace hvdlite
