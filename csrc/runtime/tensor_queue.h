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
//
// It also tracks the callers blocked in a wait (BeginWait/EndWait, from
// synchronize()), so the rank can tell the coordinator's deadlock detector
// which tensors they wait for (TakeNew's `waits`).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/node_pool.h"
#include "common/status.h"
#include "coordinator/messages.h"

namespace hvdlite {

struct TensorEntry {
  Request request;
  void* data = nullptr;    // caller's buffer; valid until the handle completes
  void* stream = nullptr;  // CUDA tensors: the framework's stream the data is ready on (null = default)
  // allgather, alltoall, reducescatter: the caller's buffer for the result (null: the core
  // allocates one and hands it over), of output_capacity bytes; valid until the handle completes.
  void* output = nullptr;
  int64_t output_capacity = 0;
  int64_t handle = 0;
};

class TensorQueue {
 public:
  TensorQueue();
  ~TensorQueue();
  int wake_fd() const { return wake_fd_; }
  // Precondition error when the name is already in flight in that set.
  Status Push(TensorEntry entry);
  // Engine: the requests not yet sent. With `waits`: also, in the same
  // snapshot, this rank's blocked callers when that report changed since the
  // last one (*waits_changed). A caller counts once it has waited
  // kWaitReportDelay, so short waits (a healthy job's steady state) cost no
  // message; ending a reported wait wakes the engine (HasNew) to report it.
  void TakeNew(std::vector<Request>* out, RankWaits* waits = nullptr, bool* waits_changed = nullptr);
  // Any thread: a caller is about to block until every one of `handles`
  // completes. Returns a token for EndWait (0: nothing to wait for here).
  // Handles of entries already executing or finished are left out.
  int64_t BeginWait(const std::vector<int64_t>& handles);
  void EndWait(int64_t token);
  // Any thread: a point-to-point receive posted as `handle` (key.p2p_src >=
  // 0). BeginWait reports a caller blocked on it like one blocked in a
  // collective, until the engine's EndP2pRecv (it completed or failed).
  void AddP2pRecv(int64_t handle, WaitKey key);
  void EndP2pRecv(int64_t handle);
  // Engine: whether this rank has point-to-point sends in flight. While it
  // has, TakeNew reports no blocked callers: the engine still moves data a
  // peer may be waiting for (coordinator/deadlock.h).
  void SetP2pSending(bool sending) { p2p_sending_.store(sending, std::memory_order_relaxed); }
  // Engine: milliseconds until an unreported wait is due for report (1000 when none).
  int MsUntilWaitReport() const;
  // Engine: entries taken by TakeNew and not executing yet (requests sent to
  // the coordinator, or held in steady state, and not run).
  size_t TakenWaiting() const;
  // Any thread: some caller is blocked waiting for an entry that is not executing.
  bool CallerBlocked() const;
  // Engine: the entry of `name` that is not executing yet, or null. The
  // pointer stays valid until the engine itself Pops or takes the entry (only
  // the engine removes entries; a Push adds others without moving this one).
  const TensorEntry* Find(int32_t process_set, const std::string& name) const;
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
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kWaitReportDelay{250};
  mutable std::mutex mu_;
  struct Slot {
    TensorEntry entry;
    bool executing = false;  // moved out by Pop, not finished yet
  };
  // (process set, name); looked up by (process set, string_view) without
  // building a string: every operation does several lookups.
  using Key = std::pair<int32_t, std::string>;
  struct KeyLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      return a.first != b.first ? a.first < b.first : std::string_view(a.second) < std::string_view(b.second);
    }
  };
  static std::pair<int32_t, std::string_view> View(int32_t process_set, const std::string& name) {
    return {process_set, name};
  }
  std::map<Key, Slot, KeyLess> in_flight_;
  std::map<int64_t, const Key*> by_handle_;  // in_flight_ entries not executing, by handle (their keys)
  // Both maps gain and lose an element per operation: their nodes are recycled.
  NodePool<std::map<Key, Slot, KeyLess>> in_flight_pool_;
  NodePool<std::map<int64_t, const Key*>> by_handle_pool_;
  struct Waiter {
    Clock::time_point since;
    std::vector<WaitKey> keys;
    std::vector<int64_t> p2p_handles;  // the receives among keys
  };
  bool StillBlocked(const Waiter& w) const;
  std::map<int64_t, WaitKey> p2p_recvs_;  // open point-to-point receives, by handle
  std::atomic<bool> p2p_sending_{false};
  std::map<int64_t, Waiter> waiters_;  // by token
  std::vector<int64_t> reported_;      // tokens of the waits last reported, ascending
  std::vector<Request> fresh_;
  int wake_fd_ = -1;
  std::atomic<uint64_t> pushed_{0};    // Push count
  uint64_t taken_ = 0;                 // pushed_ as of the last TakeNew (background thread)
  std::atomic<bool> sleeping_{false};  // the background thread may be asleep on wake_fd_
};

}  // namespace hvdlite
