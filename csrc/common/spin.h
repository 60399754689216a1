// Spinning before sleeping: SpinBudget (how long) and Spinner (one wait).
//
// A waiter that sleeps pays a wake-up (expensive on VMs whose idle vCPUs
// halt); one that spins burns a core, and on a busy host it may burn the very
// core the thread it waits for needs. So a wait polls memory for at most a
// budget after its last progress, then sleeps in the kernel, and the budget
// adapts to how waits of that kind end (SpinBudget):
//  * a wait whose event came while it was still polling restores the full
//    budget (HVDLITE_SPIN_US): polling pays here;
//  * a wait that had to sleep halves it (down to kMinSpin): the host is
//    probably busy, the peer descheduled, and polling only delays it;
//  * every kProbeEvery-th wait polls the full budget anyway, to notice when
//    the host has calmed down.
// While it polls, a Spinner either pauses (the CPU's spin-loop hint) or, when
// the host has more busy threads than cores, yields to the scheduler. A
// yielding poll costs little (the core goes to whoever is runnable, most
// likely the peer being waited for), so yielding waits get kYieldSpinFactor
// times the budget (4 ranks on 2 cores: 1 MiB allreduce ~1.3 -> ~2.4 GB/s).
//
// Threading: a SpinBudget and its Spinners belong to one thread at a time.
// Nothing here blocks longer than one sched_yield().
#pragma once
#include <sched.h>

#include <algorithm>
#include <chrono>

namespace hvdlite {

constexpr double kYieldSpinFactor = 20;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class SpinBudget {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::nanoseconds kMinSpin{500};
  static constexpr int kProbeEvery = 32;

  SpinBudget() : SpinBudget(0) {}
  explicit SpinBudget(double max_us)
      : max_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(max_us))),
        cur_(max_) {}

  // The budget of the next wait.
  Clock::duration Next() { return ++waits_ % kProbeEvery == 0 ? max_ : cur_; }
  // How the wait ended: its event came while it polled, or it had to sleep.
  void Ended(bool slept) {
    cur_ = slept ? std::max<Clock::duration>(std::min<Clock::duration>(kMinSpin, max_), cur_ / 2) : max_;
  }

 private:
  Clock::duration max_;
  Clock::duration cur_;
  unsigned waits_ = 0;
};

class Spinner {
 public:
  using Clock = SpinBudget::Clock;
  Spinner(SpinBudget* budget, bool yield) : budget_(budget), yield_(yield) {}

  // The wait made progress (or ended): tells the budget how it went; the
  // next idle stretch is a new wait.
  void Reset() {
    if (started_) budget_->Ended(slept_);
    started_ = false;
    slept_ = false;
  }

  // Called after a poll that found nothing. Returns true after pausing (or
  // yielding) while the budget lasts, false once it is spent: then the caller
  // should sleep (and call Reset() once the wait is over).
  bool Spin() {
    const Clock::time_point now = Clock::now();
    if (!started_) {
      started_ = true;
      since_ = now;
      limit_ = budget_->Next();
    }
    if (now - since_ >= limit_) {
      slept_ = true;
      return false;
    }
    if (yield_) {
      sched_yield();
    } else {
      CpuRelax();
      CpuRelax();
    }
    return true;
  }

 private:
  SpinBudget* budget_;
  bool yield_;
  bool started_ = false;
  bool slept_ = false;
  Clock::time_point since_;
  Clock::duration limit_{};
};

}  // namespace hvdlite
