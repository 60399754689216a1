#include "coordinator/autotuner.h"

#include <algorithm>

#include "common/logging.h"

namespace hvdlite {
namespace {

const int64_t kMiB = 1 << 20;
const int64_t kFusionGrid[] = {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB, 128 * kMiB};
const double kCycleGridMs[] = {0.0, 0.5, 1.0, 2.5, 5.0};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Autotuner::Autotuner(const Config& cfg) : cfg_(cfg) {
  best_ = {cfg.FUSION_THRESHOLD, cfg.CYCLE_TIME};
  if (!cfg.AUTOTUNE) return;
  tuning_ = true;
  for (int64_t f : kFusionGrid) plan_.push_back({f, cfg.CYCLE_TIME});
  warmup_left_ = static_cast<int>(std::max<int64_t>(0, cfg.AUTOTUNE_WARMUP_SAMPLES));
  sample_start_ = std::chrono::steady_clock::now();
  if (!cfg.AUTOTUNE_LOG.empty()) {
    log_ = std::fopen(cfg.AUTOTUNE_LOG.c_str(), "w");
    if (log_ == nullptr) {
      HVD_LOG(kWarning, "autotune: cannot write HVDLITE_AUTOTUNE_LOG=" << cfg.AUTOTUNE_LOG);
    } else {
      std::fprintf(log_, "fusion_threshold_bytes,cycle_time_ms,score_bytes_per_second,note\n");
      std::fflush(log_);
    }
  }
}

Autotuner::~Autotuner() {
  if (log_) std::fclose(log_);
}

void Autotuner::Log(const Candidate& c, double score, const char* note) {
  HVD_LOG(kInfo, "autotune: fusion threshold " << c.fusion_threshold << " B, cycle time " << c.cycle_time_ms
                                               << " ms: " << score / 1e9 << " GB/s (" << note << ")");
  if (log_) {
    std::fprintf(log_, "%lld,%g,%.0f,%s\n", static_cast<long long>(c.fusion_threshold), c.cycle_time_ms,
                 score, note);
    std::fflush(log_);
  }
}

void Autotuner::Record(int64_t bytes, int responses) {
  if (!tuning_ || responses <= 0) return;
  sample_bytes_ += bytes;
  sample_responses_ += responses;
  if (sample_responses_ >= std::max<int64_t>(1, cfg_.AUTOTUNE_STEPS_PER_SAMPLE)) FinishSample();
}

void Autotuner::FinishSample() {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::max(1e-9, std::chrono::duration<double>(now - sample_start_).count());
  const double score = static_cast<double>(sample_bytes_) / seconds;
  sample_bytes_ = 0;
  sample_responses_ = 0;
  sample_start_ = now;
  if (warmup_left_ > 0) {
    --warmup_left_;
    return;
  }
  samples_.push_back(score);
  if (static_cast<int>(samples_.size()) >= kMeasuredSamples) FinishCandidate();
}

void Autotuner::FinishCandidate() {
  const double score = Median(samples_);
  samples_.clear();
  Log(plan_[index_], score, "tried");
  if (score > best_score_) {
    best_score_ = score;
    best_ = plan_[index_];
  }
  warmup_left_ = static_cast<int>(std::max<int64_t>(0, cfg_.AUTOTUNE_WARMUP_SAMPLES));
  if (++index_ < plan_.size()) return;
  if (phase_ == 0) {
    phase_ = 1;
    plan_.clear();
    for (double c : kCycleGridMs) plan_.push_back({best_.fusion_threshold, c});
    index_ = 0;
    return;
  }
  tuning_ = false;
  Log(best_, best_score_, "chosen");
}

}  // namespace hvdlite
