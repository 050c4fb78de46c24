// The line a committed save prints (rank 0 or the single process), for people watching a run:
// "checkpoint: step 10 saved to ckpt/step-00000010 (1.23 MiB, 0.05 s, async)".
#pragma once

#include <cstdint>
#include <string>

namespace weft::checkpoint {

// The bytes of the files in `dir` (not recursive).
int64_t folder_bytes(const std::string& dir);

std::string saved_line(int64_t step, const std::string& dir, double seconds, bool async);
// Prints saved_line on stdout and flushes (safe from the background saver's thread: one
// printf call per line).
void print_saved(int64_t step, const std::string& dir, double seconds, bool async);

}  // namespace weft::checkpoint
