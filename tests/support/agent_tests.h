// What the tests of `weft run`'s agents share (header-only): a fresh folder per test, a file
// read whole, a free loopback port, polling a log, and the agents of one test, SIGKILLed
// (their workers die with them) and reaped however the test ends.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/proc.h"
#include "tests/support/run_weft.h"

namespace weft::test {

// <tmp>/weft_<family>_<name>_<pid>, emptied.
inline std::filesystem::path agent_test_dir(const std::string& family, const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() /
                            ("weft_" + family + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// The file's text ("" when it cannot be opened). A /proc file of a process that ends while it
// is read fails the read (ESRCH, thrown from the stream's buffer): what was read, usually
// nothing, as for a process already gone.
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  try {
    s << in.rdbuf();
  } catch (const std::exception&) {
  }
  return s.str();
}

// The node id an agent of process `pid` takes when none is given: `<hostname>-<pid>`.
inline std::string agent_node_id(pid_t pid) {
  char h[256] = "host";
  ::gethostname(h, sizeof h - 1);
  return std::string(h) + "-" + std::to_string(pid);
}

// A port nobody listens on now (the kernel's pick for port 0).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Polls until `check()` holds or the process `pid` ended (then one last check).
template <typename F>
bool wait_until(F check, pid_t pid) {
  for (;;) {
    if (check()) return true;
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return check();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Polls `log` until it holds `text` (or `pid` ended).
inline bool wait_for(const std::filesystem::path& log, const std::string& text, pid_t pid) {
  return wait_until([&] { return slurp(log).find(text) != std::string::npos; }, pid);
}

// The agents of one test: `weft ARGS` started with `env` ("K=V"; the job token), SIGKILLed
// and reaped by the destructor unless the test waited for them.
struct Agents {
  std::vector<std::string> env;
  std::vector<pid_t> pids;
  explicit Agents(std::vector<std::string> default_env = {}) : env(std::move(default_env)) {}
  ~Agents() {
    for (pid_t p : pids)
      if (p > 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
  }
  Agents(const Agents&) = delete;
  Agents& operator=(const Agents&) = delete;
  pid_t start(const std::vector<std::string>& args, const std::filesystem::path& log) {
    return start(args, log, env);
  }
  pid_t start(const std::vector<std::string>& args, const std::filesystem::path& log,
              const std::vector<std::string>& with_env) {
    pids.push_back(start_weft(args, log.string(), with_env));
    return pids.back();
  }
  // Waits for `pid` and returns its exit code (128 + signal when killed).
  int wait(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    for (pid_t& p : pids)
      if (p == pid) p = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

}  // namespace weft::test
