// Timeline: a Chrome trace (JSON array of trace events; opens in Perfetto or
// chrome://tracing) of what happened to each tensor: queueing in this process,
// negotiation across ranks, fusion-buffer copies and the collective itself
// with the backend and algorithm that ran it.
//
// As in Horovod, the coordinator (rank 0) writes it: it alone sees every
// rank's requests. Each tensor gets its own row (a trace "thread" named after
// the tensor). Spans are written as complete events ("X") when they end, so
// rows never need nesting.
// Threading: every method may be called from any thread (one mutex). When the
// timeline is off, Active() is a single relaxed atomic load.
// Blocking: writes are buffered and flushed from the calling thread past 64 KiB,
// on Flush() (the engine calls it before it waits for work, so a trace is on
// disk as soon as the job goes idle, as Horovod's is) and on Stop(); a failed
// write stops the timeline with a logged error.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "common/status.h"

namespace hvdlite {

class Timeline {
 public:
  ~Timeline() { Stop(); }
  // Starts writing to `path` (truncating it). Restarting switches files.
  Status Start(const std::string& path, bool mark_cycles);
  void Stop();
  // Writes what is buffered to the file (nothing to do when the buffer is empty).
  void Flush();
  bool Active() const { return active_.load(std::memory_order_relaxed); }
  bool MarkCycles() const { return mark_cycles_; }

  // Opens span `phase` on `tensor`'s row (a second Begin of the same pair restarts it).
  void Begin(const std::string& tensor, const std::string& phase);
  // Closes it, with optional JSON object members for "args" (e.g. "\"bytes\": 4").
  void End(const std::string& tensor, const std::string& phase, const std::string& args = "");
  // A zero-length marker on `tensor`'s row (or a global one when tensor is empty).
  void Mark(const std::string& tensor, const std::string& what, const std::string& args = "");

 private:
  int64_t NowUs() const;
  int RowLocked(const std::string& tensor);
  void WriteLocked(const std::string& event);
  void FlushLocked();

  std::mutex mu_;
  std::atomic<bool> active_{false};
  bool mark_cycles_ = false;
  std::FILE* file_ = nullptr;
  std::string buffer_;
  bool first_event_ = true;
  std::chrono::steady_clock::time_point origin_;
  std::map<std::string, int> rows_;
  std::map<std::pair<std::string, std::string>, int64_t> open_;
};

// JSON string literal for `s` (quotes included).
std::string JsonString(const std::string& s);

}  // namespace hvdlite
