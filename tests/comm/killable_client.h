// A TCPStore client in a process of its own that a test SIGKILLs: the store's view of a
// crashed client (its socket closed by the kernel, its process gone).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>

#include "comm/store/tcp_store.h"

namespace weft::test {

// Forks at construction, so construct it before the server starts and the child copies no
// running thread. The child waits for a port (start()), connects, runs `setup` on its
// TCPStore (its keys), says it is ready and SIGKILLs itself when told (kill_and_reap()).
// The destructor kills and reaps a child still running, so a failed test leaves none.
class KillableClient {
 public:
  explicit KillableClient(std::function<void(comm::TCPStore&)> setup) {
    if (::pipe(to_child_) != 0 || ::pipe(to_parent_) != 0) return;
    pid_ = ::fork();
    if (pid_ != 0) {
      ::close(to_child_[0]);
      ::close(to_parent_[1]);
      return;
    }
    ::close(to_child_[1]);
    ::close(to_parent_[0]);
    uint16_t port = 0;
    if (::read(to_child_[0], &port, sizeof port) != sizeof port) ::_exit(3);
    try {
      comm::TCPStore client("127.0.0.1", port, std::chrono::seconds(10));
      setup(client);
      const char ready = 'r';
      if (::write(to_parent_[1], &ready, 1) != 1) ::_exit(4);
      char kill = 0;
      if (::read(to_child_[0], &kill, 1) != 1) ::_exit(5);
      ::raise(SIGKILL);
    } catch (...) {
    }
    ::_exit(6);
  }
  ~KillableClient() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(to_child_[1]);
    ::close(to_parent_[0]);
  }
  KillableClient(const KillableClient&) = delete;
  KillableClient& operator=(const KillableClient&) = delete;

  // Hands the child the server's port; true once its setup ran.
  bool start(uint16_t port) {
    if (pid_ <= 0 || ::write(to_child_[1], &port, sizeof port) != ssize_t(sizeof port))
      return false;
    char ready = 0;
    return ::read(to_parent_[0], &ready, 1) == 1;
  }
  // Tells the child to SIGKILL itself and reaps it; true when it died of that signal.
  bool kill_and_reap() {
    const char kill = 'k';
    if (pid_ <= 0 || ::write(to_child_[1], &kill, 1) != 1) return false;
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) return false;
    reaped_ = true;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int to_child_[2] = {-1, -1};
  int to_parent_[2] = {-1, -1};
};

}  // namespace weft::test
