// Deadline: an absolute point on the monotonic clock that bounds a blocking wait.
#pragma once
#include <algorithm>
#include <chrono>
#include <limits>

namespace hvdlite {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline After(double seconds) {
    Deadline d;
    d.at_ =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    return d;
  }
  static Deadline Never() { return Deadline(); }

  bool expired() const { return !never() && Clock::now() >= at_; }
  bool never() const { return at_ == Clock::time_point::max(); }

  // Milliseconds left, clamped to [0, cap_ms]; cap_ms for a Never() deadline.
  int RemainingMs(int cap_ms = std::numeric_limits<int>::max()) const {
    if (never()) return cap_ms;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left < 0) return 0;
    return static_cast<int>(std::min<long long>(left, cap_ms));
  }

 private:
  Clock::time_point at_ = Clock::time_point::max();
};

}  // namespace hvdlite
