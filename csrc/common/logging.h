// Minimal leveled logging to stderr, prefixed with the rank. Thread-safe.
#pragma once
#include <sstream>
#include <string>

namespace hvdlite {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

// Set once per init(); level names are those of HVDLITE_LOG_LEVEL.
void SetLogLevel(const std::string& name);
void SetLogRank(int rank);
bool LogEnabled(LogLevel level);
void LogWrite(LogLevel level, const std::string& message);

#define HVD_LOG(level, expr)                                      \
  do {                                                            \
    if (::hvdlite::LogEnabled(::hvdlite::LogLevel::level)) {      \
      std::ostringstream _os;                                     \
      _os << expr;                                                \
      ::hvdlite::LogWrite(::hvdlite::LogLevel::level, _os.str()); \
    }                                                             \
  } while (0)

}  // namespace hvdlite
