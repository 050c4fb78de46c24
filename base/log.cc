// Logging implementation: levels and subsystem filter read once from the environment.
#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

#include "base/env.h"

namespace weft {
namespace {

std::atomic<int> g_rank{-1};

LogLevel parse_level() {
  std::string v = env_string("WEFT_LOG_LEVEL", "info");
  if (v == "error") return LogLevel::kError;
  if (v == "warn") return LogLevel::kWarn;
  if (v == "debug") return LogLevel::kDebug;
  return LogLevel::kInfo;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
  }
  return "?";
}

}  // namespace

void log_set_rank(int rank) { g_rank = rank; }

bool log_enabled(LogLevel level, const char* subsystem) {
  static const LogLevel max_level = parse_level();
  static const std::string subsystems = env_string("WEFT_LOG_SUBSYS", "");
  if (level > max_level) return false;
  if (level == LogLevel::kDebug && !subsystems.empty())
    return subsystems.find(subsystem) != std::string::npos;
  return true;
}

void log_line(LogLevel level, const char* subsystem, const std::string& message) {
  std::string line;
  int r = g_rank.load();
  if (r >= 0) line += "[rank " + std::to_string(r) + "] ";
  line += std::string(level_name(level)) + " " + subsystem + ": " + message + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace weft
