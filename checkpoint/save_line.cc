// The save line: sizes from the committed folder itself, so the figure is what is on disk.
#include "checkpoint/save_line.h"

#include <cstdio>
#include <filesystem>

namespace weft::checkpoint {

namespace fs = std::filesystem;

int64_t folder_bytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) total += int64_t(e.file_size(ec));
  return total;
}

std::string saved_line(int64_t step, const std::string& dir, double seconds, bool async) {
  char buf[96];
  std::snprintf(buf, sizeof buf, " (%.2f MiB, %.2f s, %s)",
                double(folder_bytes(dir)) / (1024.0 * 1024.0), seconds, async ? "async" : "sync");
  return "checkpoint: step " + std::to_string(step) + " saved to " + dir + buf;
}

void print_saved(int64_t step, const std::string& dir, double seconds, bool async) {
  std::printf("%s\n", saved_line(step, dir, seconds, async).c_str());
  std::fflush(stdout);
}

}  // namespace weft::checkpoint
