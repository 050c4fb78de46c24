// Per-rank error files, as torchrun's TORCHELASTIC_ERROR_FILE: a worker's top-level error
// handler records its first failure there, and `weft run` reads every rank's file to name
// the failure that came first (the root cause) instead of a rank that merely lost its peer.
#pragma once

#include <exception>
#include <optional>
#include <string>

namespace weft::launch {

// What one worker's error file says.
struct ErrorRecord {
  std::string message;  // the exception text
  std::string kind;     // error | config | peer_lost | timeout (the last two follow another's)
  int rank = -1;
  int pid = -1;
  std::string host;
  int64_t time_ms = 0;  // wall clock, ms since the epoch
};

// The environment variable `weft run` sets to each worker's file (torchrun's name; a worker
// written for torchrun's @record writes the same file).
inline constexpr const char* kErrorFileVar = "TORCHELASTIC_ERROR_FILE";

// When kErrorFileVar is set and the file does not exist yet, writes `e` into it as torchrun's
// JSON layout ({"message": {"message": ..., "extraInfo": {"timestamp": ...}}}) plus Weft's
// fields (kind, rank, pid, host, timestamp_ms). Never throws; does nothing on any failure.
void record_error(const std::exception& e) noexcept;

// Reads a file written by record_error (or by torchrun's @record: message and timestamp).
// nullopt when it is absent or unreadable.
std::optional<ErrorRecord> read_error_file(const std::string& path);

// Wall-clock milliseconds since the epoch; "2026-05-12 14:03:07.123" in local time.
int64_t now_ms();
std::string format_time_ms(int64_t ms);

}  // namespace weft::launch
