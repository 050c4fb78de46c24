// `weft run --standalone --nproc-per-node N -- weft train ...`: a plain local spawner. It
// serves the rendezvous store, starts N workers with WEFT_RANK / WEFT_WORLD_SIZE /
// WEFT_STORE_ADDR, prefixes their output lines with [rank r], forwards Ctrl-C, and when a
// worker fails stops the others and exits non-zero naming it. (The elastic agent comes later.)
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store_server.h"
#include "launch/args.h"
#include "launch/commands.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp =
    R"(usage: weft run --standalone --nproc-per-node N [options] -- COMMAND [ARGS...]

  --standalone          one machine: serve the rendezvous store here (required for now)
  --nproc-per-node N    number of workers to start
  --store-port P        port of the store (default 0: a free one)
  --grace S             seconds a failed job's other workers get after SIGTERM (default 5)

Each worker runs COMMAND with WEFT_RANK, WEFT_LOCAL_RANK, WEFT_WORLD_SIZE and WEFT_STORE_ADDR
set; a COMMAND of `weft` runs this binary. Output lines are prefixed with [rank r]. Ctrl-C is
forwarded to every worker. When a worker fails the others are stopped and the exit code is
the worker's (1 when it was killed by a signal).
)";

volatile std::sig_atomic_t g_interrupts = 0;
void on_sigint(int) { g_interrupts = g_interrupts + 1; }

struct Worker {
  pid_t pid = -1;
  int fd = -1;          // read end of its stdout+stderr
  std::string partial;  // an unfinished line
  bool running = true;
  int status = 0;
};

void emit_lines(int rank, Worker& w, bool flush_all) {
  size_t start = 0, nl;
  while ((nl = w.partial.find('\n', start)) != std::string::npos) {
    std::printf("[rank %d] %.*s\n", rank, int(nl - start), w.partial.data() + start);
    start = nl + 1;
  }
  w.partial.erase(0, start);
  if (flush_all && !w.partial.empty()) {
    std::printf("[rank %d] %s\n", rank, w.partial.c_str());
    w.partial.clear();
  }
  std::fflush(stdout);
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "weft";
  buf[n] = 0;
  return buf;
}

pid_t spawn(const std::vector<std::string>& cmd, int rank, int world, const std::string& store,
            int out_fd) {
  pid_t pid = ::fork();
  if (pid < 0) throw IoError(std::string("weft run: fork failed: ") + std::strerror(errno));
  if (pid > 0) return pid;
  // Child: its own process group, so that only the launcher decides whom Ctrl-C reaches.
  ::setpgid(0, 0);
  ::dup2(out_fd, 1);
  ::dup2(out_fd, 2);
  ::setenv("WEFT_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WEFT_LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WEFT_WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("WEFT_STORE_ADDR", store.c_str(), 1);
  // Share the cores among the workers unless the user chose (torchrun sets 1): N workers
  // each running the OpenMP default of all cores oversubscribe them several times over.
  if (!std::getenv("OMP_NUM_THREADS")) {
    long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1L, cores / world)).c_str(), 1);
  }
  std::vector<std::string> args = cmd;
  if (args[0] == "weft") args[0] = self_exe();
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "weft run: cannot start '%s': %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + ::strsignal(WTERMSIG(status));
  return "stopped";
}

}  // namespace

int cmd_run(const std::vector<std::string>& argv) {
  auto sep = std::find(argv.begin(), argv.end(), std::string("--"));
  std::vector<std::string> own(argv.begin(), sep);
  if (std::find(own.begin(), own.end(), "--help") != own.end() ||
      std::find(own.begin(), own.end(), "-h") != own.end()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  Args a(own, {"--nproc-per-node", "--store-port", "--grace"}, {"--standalone"});
  if (!a.flag("--standalone"))
    throw ConfigError("--standalone",
                      "only single-machine runs are supported yet; pass --standalone");
  int64_t n = a.get_int("--nproc-per-node", -1);
  if (n < 1 || n > 4096)
    throw ConfigError("--nproc-per-node", "give the number of workers, e.g. --nproc-per-node 2");
  if (sep == argv.end() || sep + 1 == argv.end())
    throw ConfigError("--", "give the worker command after --, e.g. -- weft train --config X.yaml");
  std::vector<std::string> cmd(sep + 1, argv.end());
  int64_t port = a.get_int("--store-port", 0);
  if (port < 0 || port > 65535)
    throw ConfigError("--store-port", "expected a port number 0..65535");
  int64_t grace = a.get_int("--grace", 5);

  comm::TCPStoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = uint16_t(port);
  so.token = comm::auth::generate_token();  // a fresh job token; workers get it below
  ::setenv("WEFT_JOB_TOKEN", so.token.c_str(), 1);
  comm::TCPStoreServer server(so);
  std::string store = "127.0.0.1:" + std::to_string(server.port());

  std::signal(SIGINT, on_sigint);
  std::signal(SIGPIPE, SIG_IGN);
  std::fflush(stdout);
  std::vector<Worker> workers(static_cast<size_t>(n));
  for (int r = 0; r < int(n); ++r) {
    int fds[2];
    if (::pipe(fds) != 0)
      throw IoError(std::string("weft run: pipe failed: ") + std::strerror(errno));
    workers[size_t(r)].pid = spawn(cmd, r, int(n), store, fds[1]);
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    workers[size_t(r)].fd = fds[0];
  }

  int failed = -1;  // the first worker that failed
  int forwarded = 0;
  auto t_stop = std::chrono::steady_clock::time_point::max();
  for (;;) {
    if (g_interrupts > forwarded) {  // forward Ctrl-C (a second one is forwarded too)
      forwarded = g_interrupts;
      for (Worker& w : workers)
        if (w.running) ::kill(w.pid, SIGINT);
    }
    std::vector<pollfd> pfds;
    std::vector<int> who;
    for (size_t r = 0; r < workers.size(); ++r)
      if (workers[r].fd >= 0) pfds.push_back({workers[r].fd, POLLIN, 0}), who.push_back(int(r));
    if (!pfds.empty()) ::poll(pfds.data(), pfds.size(), 50);
    for (size_t i = 0; i < pfds.size(); ++i) {
      Worker& w = workers[size_t(who[i])];
      char buf[8192];
      for (;;) {
        ssize_t k = ::read(w.fd, buf, sizeof buf);
        if (k > 0) {
          w.partial.append(buf, size_t(k));
          continue;
        }
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
          ::close(w.fd);
          w.fd = -1;
        }
        break;
      }
      emit_lines(who[i], w, w.fd < 0);
    }
    bool any_running = false;
    for (size_t r = 0; r < workers.size(); ++r) {
      Worker& w = workers[r];
      if (!w.running) continue;
      if (::waitpid(w.pid, &w.status, WNOHANG) == w.pid) {
        w.running = false;
        // After a forwarded Ctrl-C, 130 is a worker that stopped cleanly, not a failure.
        bool ok = WIFEXITED(w.status) &&
                  (WEXITSTATUS(w.status) == 0 || (g_interrupts && WEXITSTATUS(w.status) == 130));
        if (!ok && failed < 0 && t_stop == std::chrono::steady_clock::time_point::max()) {
          failed = int(r);
          std::fprintf(stderr, "weft run: rank %zu %s; stopping the other workers\n", r,
                       describe(w.status).c_str());
          for (Worker& o : workers)
            if (o.running) ::kill(o.pid, SIGTERM);
          t_stop = std::chrono::steady_clock::now() + std::chrono::seconds(grace);
        }
      } else {
        any_running = true;
      }
    }
    if (std::chrono::steady_clock::now() > t_stop)
      for (Worker& o : workers)
        if (o.running) ::kill(o.pid, SIGKILL);
    bool any_open = false;
    for (Worker& w : workers) any_open = any_open || w.fd >= 0;
    if (!any_running && !any_open) break;
    if (!any_running) {  // take what is left; a pipe a grandchild still holds is closed
      for (size_t r = 0; r < workers.size(); ++r) {
        Worker& w = workers[r];
        if (w.fd < 0) continue;
        char buf[8192];
        ssize_t k;
        while ((k = ::read(w.fd, buf, sizeof buf)) > 0) w.partial.append(buf, size_t(k));
        ::close(w.fd);
        w.fd = -1;
        emit_lines(int(r), w, true);
      }
    }
  }
  if (failed >= 0) {
    const Worker& w = workers[size_t(failed)];
    if (WIFSIGNALED(w.status))
      std::fprintf(stderr, "weft run: failed: lost rank %d (it %s)\n", failed,
                   describe(w.status).c_str());
    else
      std::fprintf(stderr, "weft run: failed: rank %d %s\n", failed, describe(w.status).c_str());
    return WIFEXITED(w.status) && WEXITSTATUS(w.status) != 0 ? WEXITSTATUS(w.status) : 1;
  }
  if (g_interrupts) return 130;
  return 0;
}

}  // namespace weft::launch
