// The worker's heartbeat thread (see heartbeat.h).
#include "launch/heartbeat.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
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

}  // namespace weft::launch
