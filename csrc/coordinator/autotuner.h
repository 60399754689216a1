// Autotuner: picks the fusion threshold and cycle time online, on rank 0, by
// the allreduce throughput (bytes per second of wall time) each setting gives.
//
// Search: coordinate descent over two small grids. First every fusion
// threshold is tried at the configured cycle time, then every cycle time at
// the best threshold; each candidate runs for warm-up samples (discarded) and
// then kMeasuredSamples samples of HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE executed
// allreduce responses; its score is the median sample. The best candidate is
// kept for the rest of the job. Every score and the final choice are logged
// (HVD_LOG info, and as CSV to HVDLITE_AUTOTUNE_LOG when set).
// Only rank 0 needs it: both knobs act in the coordinator.
// Threading: background thread of rank 0 only.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/config.h"

namespace hvdlite {

class Autotuner {
 public:
  explicit Autotuner(const Config& cfg);
  ~Autotuner();
  bool tuning() const { return tuning_; }
  int64_t fusion_threshold() const { return current().fusion_threshold; }
  double cycle_time_ms() const { return current().cycle_time_ms; }
  // Rank 0 executed `responses` allreduce responses moving `bytes` in total.
  void Record(int64_t bytes, int responses);

 private:
  struct Candidate {
    int64_t fusion_threshold;
    double cycle_time_ms;
  };
  static constexpr int kMeasuredSamples = 3;

  const Candidate& current() const { return tuning_ ? plan_[index_] : best_; }
  void FinishSample();
  void FinishCandidate();
  void Log(const Candidate& c, double score, const char* note);

  Config cfg_;
  bool tuning_ = false;
  int phase_ = 0;                // 0: fusion thresholds, 1: cycle times
  std::vector<Candidate> plan_;  // candidates of the current phase
  size_t index_ = 0;
  std::vector<double> samples_;  // scores of the current candidate
  int warmup_left_ = 0;
  int64_t sample_bytes_ = 0;
  int sample_responses_ = 0;
  std::chrono::steady_clock::time_point sample_start_;
  Candidate best_;
  double best_score_ = -1;
  std::FILE* log_ = nullptr;
};

}  // namespace hvdlite
