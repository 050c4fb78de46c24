// Logging filtered by level and subsystem (NCCL's debug.h style).
// WEFT_LOG_LEVEL=error|warn|info|debug (default info); WEFT_LOG_SUBSYS=comm,planner
// limits debug output to those subsystems. Lines carry "[rank r]" once set.
#pragma once

#include <string>

#include "base/check.h"

namespace weft {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Sets the rank shown in every log line (-1 hides it). Call once per process.
void log_set_rank(int rank);
bool log_enabled(LogLevel level, const char* subsystem);
// Writes one line to stderr; thread-safe (one write call per line).
void log_line(LogLevel level, const char* subsystem, const std::string& message);

}  // namespace weft

#define WEFT_LOG(level, subsys, ...)                                               \
  do {                                                                             \
    if (::weft::log_enabled(::weft::LogLevel::level, subsys))                      \
      ::weft::log_line(::weft::LogLevel::level, subsys, ::weft::str(__VA_ARGS__)); \
  } while (0)
#define WEFT_INFO(subsys, ...) WEFT_LOG(kInfo, subsys, __VA_ARGS__)
#define WEFT_WARN(subsys, ...) WEFT_LOG(kWarn, subsys, __VA_ARGS__)
#define WEFT_DEBUG(subsys, ...) WEFT_LOG(kDebug, subsys, __VA_ARGS__)
