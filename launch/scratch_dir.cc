#include "launch/scratch_dir.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <optional>

#include "base/error.h"

namespace weft::launch {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "weft_run_";

// The owner pid of a scratch folder's name ("weft_run_<pid>_XXXXXX"), or none.
std::optional<pid_t> owner_of(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  const std::string rest = name.substr(std::string(kPrefix).size());
  const size_t us = rest.find('_');
  if (us == 0 || us == std::string::npos || us > 9) return std::nullopt;
  for (size_t i = 0; i < us; ++i)
    if (rest[i] < '0' || rest[i] > '9') return std::nullopt;
  return pid_t(std::stol(rest.substr(0, us)));
}

}  // namespace

int ScratchDir::remove_abandoned(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::optional<pid_t> pid = owner_of(e.path().filename().string());
    // Only a pid that is certainly gone: a live process (ours or not, EPERM) keeps its folder.
    if (!pid || *pid <= 0 || ::kill(*pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (fs::remove_all(e.path(), rm) > 0 && !rm) ++removed;
  }
  return removed;
}

ScratchDir::ScratchDir() {
  const std::string tmp = fs::temp_directory_path().string();
  remove_abandoned(tmp);
  std::string t =
      (fs::path(tmp) / (std::string(kPrefix) + std::to_string(::getpid()) + "_XXXXXX")).string();
  if (!::mkdtemp(t.data())) throw IoError("weft run: cannot create a folder under " + t);
  path_ = t;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace weft::launch
