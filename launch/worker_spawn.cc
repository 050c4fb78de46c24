// fork/exec of workers with the parent-death guarantees, and the guardian process.
#include "launch/worker_spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "base/error.h"

extern char** environ;

namespace weft::launch {

namespace {

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "weft";
  buf[n] = 0;
  return buf;
}

// Closes every descriptor from `first` up (async-signal-safe; after fork in a threaded
// process nothing else is allowed).
void close_from(int first) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, (unsigned)first, ~0U, 0) == 0) return;
#endif
  rlimit rl{};
  long top = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                 ? long(rl.rlim_cur) : 65536;
  for (long fd = first; fd < top && fd < (1 << 20); ++fd) ::close(int(fd));
}

void io_fail(const char* what) {
  throw IoError(std::string("weft run: ") + what + " failed: " + std::strerror(errno));
}

}  // namespace

SpawnedWorker spawn_worker(const std::vector<std::string>& command,
                           const std::vector<std::pair<std::string, std::string>>& env) {
  // Everything the child needs is built here: after fork only async-signal-safe calls.
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) vars[k] = v;
  std::vector<std::string> env_text;
  for (const auto& [k, v] : vars) env_text.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  if (args[0] == "weft") args[0] = self_exe();
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  char fail_msg[512];
  std::snprintf(fail_msg, sizeof fail_msg, "weft run: cannot start '%s': ", args[0].c_str());

  int out[2], err[2], beat[2];
  if (::pipe2(out, O_CLOEXEC) != 0) io_fail("pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) io_fail("pipe");
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, beat) != 0) io_fail("socketpair");
  pid_t agent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) io_fail("fork");
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: the agent signals the worker's whole tree
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != agent) ::_exit(1);  // the agent died before the line above
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);  // ignored dispositions would survive exec
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    if (beat[1] != kWorkerBeatFd) ::dup2(beat[1], kWorkerBeatFd);
    else ::fcntl(kWorkerBeatFd, F_SETFD, 0);
    close_from(kWorkerBeatFd + 1);  // the store's socket and every other agent descriptor
    ::execvpe(argv[0], argv.data(), envp.data());
    int e = errno;
    (void)!::write(2, fail_msg, std::strlen(fail_msg));
    const char* why = ::strerror(e);
    (void)!::write(2, why, std::strlen(why));
    (void)!::write(2, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that the group exists before the agent signals it
  ::close(out[1]);
  ::close(err[1]);
  ::close(beat[1]);
  for (int fd : {out[0], err[0], beat[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return {pid, out[0], err[0], beat[0]};
}

// ---- the guardian ---------------------------------------------------------------------

Guardian::Guardian() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) io_fail("pipe");
  pid_t pid = ::fork();
  if (pid < 0) io_fail("fork");
  if (pid == 0) {
    ::setpgid(0, 0);  // out of the agent's group: `timeout` and Ctrl-C signal that group
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(s, SIG_IGN);
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(p[0], 3);
    for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);  // nobody waits on our output
    close_from(4);
    static pid_t groups[8192];
    int n = 0;
    int32_t msg[2];
    for (;;) {
      ssize_t k = ::read(3, msg, sizeof msg);
      if (k < 0 && errno == EINTR) continue;
      if (k != ssize_t(sizeof msg)) break;  // the agent is gone (or closed us)
      if (msg[0] == 1 && n < 8192) groups[n++] = msg[1];
      if (msg[0] == 0)
        for (int i = 0; i < n; ++i)
          if (groups[i] == msg[1]) groups[i] = groups[--n];
    }
    for (int i = 0; i < n; ++i) ::kill(-groups[i], SIGKILL);
    ::_exit(0);
  }
  ::close(p[0]);
  fd_ = p[1];
  pid_ = pid;
}

Guardian::~Guardian() {
  if (fd_ >= 0) ::close(fd_);
  // The guardian's loop ends on the closed pipe; it only signals groups before it exits.
  if (pid_ > 0)
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
}

void Guardian::send(int op, pid_t pgid) {
  int32_t msg[2] = {op, int32_t(pgid)};
  ssize_t k;
  do k = ::write(fd_, msg, sizeof msg);
  while (k < 0 && errno == EINTR);
}

void Guardian::watch(pid_t pgid) { send(1, pgid); }
void Guardian::release(pid_t pgid) { send(0, pgid); }

}  // namespace weft::launch
