// Finding and removing what killed snapshot agents leave behind: checkpoint/snapshot_agent_files.h.
#include "checkpoint/snapshot_agent_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "base/check.h"
#include "base/error.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSocketPrefix = "weft-snapshot-";
constexpr const char* kLockPrefix = "weft-agent-";

std::string socket_file(const std::string& job, int node) {
  return kSocketPrefix + job + "-n" + std::to_string(node) + ".sock";
}

// The directories a socket may be in: the temporary directory and /tmp (its fallback).
std::vector<fs::path> socket_dirs() {
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  std::vector<fs::path> dirs = {"/tmp"};
  if (!ec && tmp != "/tmp" && tmp != "/tmp/") dirs.push_back(tmp);
  return dirs;
}

// (job, node) of a file named <prefix><job>-n<node><suffix>, or nullopt.
std::optional<std::pair<std::string, int>> parse(const std::string& name, const std::string& prefix,
                                                 const std::string& suffix) {
  if (!name.starts_with(prefix) || !name.ends_with(suffix)) return std::nullopt;
  const std::string mid = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  const size_t n = mid.rfind("-n");
  if (n == std::string::npos || n == 0 || n + 2 >= mid.size()) return std::nullopt;
  int node = 0;
  for (char c : mid.substr(n + 2)) {
    if (c < '0' || c > '9' || node > 1'000'000) return std::nullopt;
    node = node * 10 + (c - '0');
  }
  return std::make_pair(mid.substr(0, n), node);
}

// Whether a process accepts connections on the Unix socket at `path`.
bool served(const std::string& path) {
  sockaddr_un a{};
  if (path.size() >= sizeof a.sun_path) return false;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // cannot tell: keep it
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size());
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  const int err = errno;
  ::close(fd);
  // Refused: nobody listens. Anything else (a full backlog, EAGAIN): someone may.
  return ok || (err != ECONNREFUSED && err != ENOENT);
}

bool is_socket(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

}  // namespace

std::string agent_socket_path(const std::string& job, int node) {
  const std::string file = socket_file(job, node);
  std::error_code ec;
  const fs::path dir = fs::temp_directory_path(ec);
  std::string path = (ec ? fs::path("/tmp") : dir) / file;
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) path = "/tmp/" + file;
  return path;
}

std::string agent_lock_path(const std::string& job, int node) {
  return "/dev/shm/" + std::string(kLockPrefix) + job + "-n" + std::to_string(node) + ".lock";
}

bool holds_agent_lock(int fd, const std::string& job, int node) {
  struct stat held = {};
  struct stat named = {};
  // flock on a descriptor whose open file already holds the lock succeeds: it is ours.
  return ::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &held) == 0 &&
         ::stat(agent_lock_path(job, node).c_str(), &named) == 0 && held.st_ino == named.st_ino &&
         held.st_dev == named.st_dev;
}

int take_agent_lock(const std::string& job, int node, std::chrono::milliseconds patience) {
  const std::string path = agent_lock_path(job, node);
  const auto until = std::chrono::steady_clock::now() + patience;
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
      throw IoError(str("cannot open the snapshot agent lock ", path, ": ", std::strerror(errno)));
    if (holds_agent_lock(fd, job, node)) return fd;
    const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
    ::close(fd);
    // Taken on a file a sweep unlinked meanwhile: again at once, on the file named now.
    if (!held) continue;
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> remove_stale_agent_files(const std::string& job, int node) {
  std::vector<std::string> removed;
  const std::string lock = agent_lock_path(job, node);
  const bool had_lock = ::access(lock.c_str(), F_OK) == 0;
  // Created when missing: held while the socket goes, it keeps an agent from starting then.
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return removed;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // its agent lives
    ::close(fd);
    return removed;
  }
  for (const fs::path& dir : socket_dirs()) {
    const std::string path = (dir / socket_file(job, node)).string();
    if (is_socket(path) && !served(path) && ::unlink(path.c_str()) == 0) removed.push_back(path);
  }
  // Before the unlock, as the agent does: no window in which the file is there unlocked.
  if (::unlink(lock.c_str()) == 0 && had_lock) removed.push_back(lock);
  ::close(fd);
  return removed;
}

std::vector<std::string> remove_stale_agent_files(const std::string& job) {
  std::set<std::pair<std::string, int>> agents;
  auto collect = [&](const fs::path& dir, const std::string& prefix, const std::string& suffix) {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      std::optional<std::pair<std::string, int>> p =
          parse(e.path().filename().string(), prefix, suffix);
      if (p && (job.empty() || p->first == job)) agents.insert(*p);
    }
  };
  for (const fs::path& dir : socket_dirs()) collect(dir, kSocketPrefix, ".sock");
  collect("/dev/shm", kLockPrefix, ".lock");
  std::vector<std::string> removed;
  for (const auto& [j, node] : agents) {
    std::vector<std::string> r = remove_stale_agent_files(j, node);
    removed.insert(removed.end(), r.begin(), r.end());
  }
  return removed;
}

}  // namespace weft::checkpoint
