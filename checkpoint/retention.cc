// Retention and the names of the folders it decides on. A folder is deleted only when its
// metadata verifies and names this job, or when it is a temporary folder whose writer is
// known to be gone: a stale or foreign folder under the same root is never lost.
#include "checkpoint/retention.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "checkpoint/checkpoint.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOwnerFile = "owner";

// True when `tmp`'s owner file names this host and a pid that no process has now.
bool owner_is_gone(const fs::path& tmp) {
  std::ifstream in(tmp / kOwnerFile);
  std::string host;
  long long pid = 0;
  if (!(in >> host >> pid) || pid <= 0 || host != host_name()) return false;
  return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

void remove_logged(const fs::path& p, const char* what) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) WEFT_WARN("checkpoint", "cannot remove ", what, " ", p.string(), ": ", ec.message());
}

}  // namespace

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", (long long)step);
  return buf;
}

int64_t step_of_folder(const std::string& path) {
  std::string n = fs::path(path).filename().string();
  if (n.empty()) n = fs::path(path).parent_path().filename().string();  // a trailing slash
  long long s = -1;
  char tail;
  if (std::sscanf(n.c_str(), "step-%lld%c", &s, &tail) != 1 || s < 0) return -1;
  return s;
}

std::string tmp_folder(const std::string& root, int64_t step, const std::string& job_id) {
  return (fs::path(root) / (".tmp-" + step_name(step) + "-" + job_id)).string();
}

void write_owner(const std::string& tmp) {
  std::ofstream out(fs::path(tmp) / kOwnerFile);
  out << host_name() << " " << ::getpid() << "\n";
  if (!out) throw IoError("checkpoint: cannot write " + (fs::path(tmp) / kOwnerFile).string());
}

void remove_owner(const std::string& tmp) {
  std::error_code ec;
  fs::remove(fs::path(tmp) / kOwnerFile, ec);
}

void prune(const std::string& root, int64_t keep, int64_t committed, const std::string& job_id) {
  std::vector<std::string> own;  // oldest first, as list_checkpoints gives them
  for (const std::string& dir : list_checkpoints(root)) {
    if (step_of_folder(dir) > committed) continue;
    try {
      if (read_metadata(dir, "").job_id == job_id) own.push_back(dir);
    } catch (const std::exception&) {
      // Not provably this job's: leave it for a person to look at.
    }
  }
  const size_t kept = size_t(std::max<int64_t>(keep, 1));
  for (size_t i = 0; i + kept < own.size(); ++i) remove_logged(own[i], "old checkpoint");

  const std::string own_suffix = "-" + job_id;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    long long s = -1;
    if (n.rfind(".tmp-step-", 0) != 0 || std::sscanf(n.c_str(), ".tmp-step-%lld", &s) != 1)
      continue;
    const bool mine = n.size() > own_suffix.size() &&
                      n.compare(n.size() - own_suffix.size(), own_suffix.size(), own_suffix) == 0;
    if ((mine && s <= committed) || (!mine && owner_is_gone(e.path())))
      remove_logged(e.path(), "temporary folder");
  }
}

}  // namespace weft::checkpoint
