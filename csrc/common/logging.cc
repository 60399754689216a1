#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace hvdlite {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
std::mutex g_write_mu;
const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
}  // namespace

void SetLogLevel(const std::string& name) {
  const char* lower[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  for (int i = 0; i < 6; ++i) {
    if (name == lower[i] || name == kNames[i]) g_level = i;
  }
}

void SetLogRank(int rank) { g_rank = rank; }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed); }

void LogWrite(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fprintf(stderr, "[hvdlite %s rank %d] %s\n", kNames[static_cast<int>(level)], g_rank.load(),
               message.c_str());
  std::fflush(stderr);
}

}  // namespace hvdlite
