// The agents of `weft bench elastic`: fork/exec with one output pipe, line stamping, reaping.
#include "launch/bench_elastic_agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <utility>

#include "base/error.h"
#include "launch/scratch_dir.h"

namespace weft::launch {

BenchAgent::BenchAgent(const std::vector<std::string>& argv, const std::string& log_path,
                       Clock::time_point origin)
    : origin_(origin) {
  log_ = std::fopen(log_path.c_str(), "we");
  if (!log_)
    throw IoError("weft bench elastic: cannot write " + log_path + ": " + std::strerror(errno));
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw IoError(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    ::setpgid(0, 0);  // a Ctrl-C of the bench is not the agents' (they die with the bench)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(p[1], 1);
    ::dup2(p[1], 2);
    ::execv(cargs[0], cargs.data());
    const char* why = ::strerror(errno);
    (void)!::write(2, why, std::strlen(why));
    ::_exit(127);
  }
  ::close(p[1]);
  fd_ = p[0];
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

BenchAgent::~BenchAgent() {
  if (running_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    if (::waitpid(pid_, &status, 0) == pid_) reaped(status);
  }
  if (fd_ >= 0) ::close(fd_);
  if (log_) std::fclose(log_);
}

void BenchAgent::add_line(std::string text) {
  const double t = std::chrono::duration<double>(Clock::now() - origin_).count();
  std::fprintf(log_, "%10.3f %s\n", t, text.c_str());
  lines_.push_back({t, std::move(text)});
}

void BenchAgent::pump() {
  char buf[16384];
  while (fd_ >= 0) {
    ssize_t k = ::read(fd_, buf, sizeof buf);
    if (k > 0) {
      partial_.append(buf, size_t(k));
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno == EAGAIN) break;
    ::close(fd_);  // end of file: the agent and every writer are gone
    fd_ = -1;
  }
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1)
    add_line(partial_.substr(start, nl - start));
  partial_.erase(0, start);
  if (fd_ < 0 && !partial_.empty()) add_line(std::exchange(partial_, ""));
  std::fflush(log_);
  int status = 0;
  if (running_ && ::waitpid(pid_, &status, WNOHANG) == pid_) reaped(status);
}

void BenchAgent::reaped(int status) {
  running_ = false;
  code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // A killed weft run could not remove its scratch folder; now that its pid is gone, the
  // sweep every weft run makes at its start removes it (and any other dead owner's). One
  // that fails (a folder that cannot be read) leaves them to the next weft run, as before.
  try {
    std::error_code ec;
    const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (!ec) ScratchDir::remove_abandoned(tmp.string());
  } catch (const std::exception&) {
  }
}

void BenchAgent::kill() {
  if (running_) ::kill(pid_, SIGKILL);
}

void pump_agents(std::vector<std::unique_ptr<BenchAgent>>& agents, int ms) {
  std::vector<pollfd> fds;
  for (auto& a : agents)
    if (a->fd() >= 0) fds.push_back({a->fd(), POLLIN, 0});
  if (fds.empty())
    ::usleep(useconds_t(ms) * 1000);
  else
    ::poll(fds.data(), fds.size(), ms);
  for (auto& a : agents) a->pump();
}

}  // namespace weft::launch
