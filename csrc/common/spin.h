// Spinner: the busy phase of a wait that polls memory before it sleeps.
//
// A waiter that sleeps pays a wake-up (expensive on VMs whose idle vCPUs
// halt); one that spins forever burns a core. So a wait polls for at most
// `spin_us` after its last progress, then sleeps in the kernel. While it polls
// it either pauses (the CPU's spin-loop hint: cheap, keeps the core) or, when
// the host has more busy threads than cores, yields to the scheduler so that
// the thread it waits for can run.
//
// Threading: one Spinner per wait, used by one thread. Never blocks longer
// than one sched_yield().
#pragma once
#include <sched.h>

#include <chrono>

namespace hvdlite {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class Spinner {
 public:
  Spinner(double spin_us, bool yield)
      : budget_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(spin_us))),
        yield_(yield) {}

  // The wait made progress: the next idle stretch gets the full budget again.
  void Reset() { started_ = false; }

  // Called after a poll that found nothing. Returns true after pausing (or
  // yielding) while the busy budget lasts, false once it is spent: then the
  // caller should sleep (and call Reset() when it wakes with progress).
  bool Spin() {
    const Clock::time_point now = Clock::now();
    if (!started_) {
      started_ = true;
      since_ = now;
    }
    if (now - since_ >= budget_) return false;
    if (yield_) {
      sched_yield();
    } else {
      CpuRelax();
      CpuRelax();
    }
    return true;
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::duration budget_;
  bool yield_;
  bool started_ = false;
  Clock::time_point since_;
};

}  // namespace hvdlite
