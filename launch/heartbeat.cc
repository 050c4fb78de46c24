// The worker's heartbeat thread (see heartbeat.h).
#include "launch/heartbeat.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace weft::launch {
namespace {
std::atomic<int> g_fd{-1};  // the heartbeat socket once start_agent_heartbeat took it
}  // namespace

void poke_agent() noexcept {
  const int fd = g_fd.load();
  if (fd >= 0) (void)::send(fd, &kPokeByte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void start_agent_heartbeat() noexcept {
  static std::atomic<bool> started{false};
  const char* fd_text = std::getenv(kHeartbeatFdVar);
  if (!fd_text || !*fd_text || started.exchange(true)) return;
  int fd = std::atoi(fd_text);
  if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) return;
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  g_fd = fd;
  double interval = 1.0;
  if (const char* s = std::getenv(kHeartbeatIntervalVar)) interval = std::atof(s);
  if (!(interval > 0)) interval = 1.0;
  auto period = std::chrono::microseconds(int64_t(interval * 1e6));
  try {
    std::thread([fd, period] {
      ::pthread_setname_np(::pthread_self(), kHeartbeatThreadName);
      for (;;) {
        // MSG_NOSIGNAL: an agent that is gone must not kill the worker with SIGPIPE.
        if (::send(fd, &kBeatByte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN &&
            errno != EINTR)
          return;
        std::this_thread::sleep_for(period);
      }
    }).detach();
  } catch (...) {
  }
}

namespace {
// The first `cap` bytes of a small /proc file; empty when it cannot be read.
std::string read_small(const std::string& path, size_t cap) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out(cap, '\0');
  ssize_t n = ::read(fd, out.data(), cap);
  ::close(fd);
  out.resize(n > 0 ? size_t(n) : 0);
  return out;
}
}  // namespace

bool heartbeat_thread_runnable(int pid) noexcept {
  try {
    const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
    DIR* dir = ::opendir(tasks.c_str());
    if (!dir) return false;
    bool runnable = false;
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const std::string task = tasks + "/" + e->d_name;
      std::string comm = read_small(task + "/comm", 64);
      if (comm != std::string(kHeartbeatThreadName) + "\n") continue;
      // The state follows the ") " that closes the command name (which may hold spaces).
      std::string stat = read_small(task + "/stat", 256);
      size_t close = stat.rfind(')');
      runnable = close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'R';
      break;
    }
    ::closedir(dir);
    return runnable;
  } catch (...) {
    return false;
  }
}

}  // namespace weft::launch
