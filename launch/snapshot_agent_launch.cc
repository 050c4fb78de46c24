// Starting, watching, restarting, finishing and stopping the node's snapshot agent for
// weft run (standalone and multi-node alike).
#include "launch/snapshot_agent_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_agent_files.h"
#include "checkpoint/snapshot_protocol.h"
#include "core/config/job_spec.h"
#include "launch/args.h"

namespace weft::launch {

namespace fs = std::filesystem;

namespace {

// How long a held agent lock is tried again (checkpoint::take_agent_lock says why).
constexpr std::chrono::milliseconds kLockPatience{500};
// The descriptor the agent finds its lock at (--lock-fd): the first after stdin/out/err.
constexpr int kAgentLockFd = 3;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    throw IoError(
        "weft run: cannot find its own binary (/proc/self/exe) to start the snapshot agent");
  buf[n] = 0;
  return buf;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + ::strsignal(WTERMSIG(status));
  return "ended";
}

}  // namespace

std::optional<SnapshotAgentPlan> snapshot_agent_plan(const std::vector<std::string>& command,
                                                     const std::string& run_id, int node) {
  if (command.size() < 2 || fs::path(command[0]).filename() != "weft" || command[1] != "train")
    return std::nullopt;
  SnapshotAgentPlan p;
  try {
    // weft train's own options (launch/cmd_train.cc), so that its arguments read the same.
    Args args(std::vector<std::string>(command.begin() + 2, command.end()),
              {"--config", "--set", "--init-weights", "--save-weights", "--metrics", "--resume"},
              {"--help"});
    if (args.flag("--help") || !args.has("--config")) return std::nullopt;
    core::JobSpec spec = core::load_job_spec(args.get("--config"), args.all("--set"));
    if (!spec.snapshot.enabled()) return std::nullopt;
    p.redundancy = spec.snapshot.redundancy;
    p.ec_k = int(spec.snapshot.ec_k);
    p.ec_m = int(spec.snapshot.ec_m);
  } catch (const std::exception&) {
    return std::nullopt;  // the worker says what is wrong, with its exit code
  }
  p.job_id = checkpoint::job_id_for_run(run_id);
  p.node = node;  // the one wanted: SnapshotAgentProcess chooses
  p.socket = checkpoint::agent_socket_path(p.job_id, node);
  return p;
}

SnapshotAgentProcess::SnapshotAgentProcess(SnapshotAgentPlan plan) : plan_(std::move(plan)) {
  const int lock = choose_index();
  ::setenv(checkpoint::kSnapshotSocketVar, plan_.socket.c_str(), 1);
  spawn(lock);
  if (!wait_ready(10)) {
    stop();
    throw IoError(str("weft run: the snapshot agent for job ", plan_.job_id,
                      " did not start (its error above); "
                      "set snapshot.every: 0 to run without in-memory snapshots"));
  }
}

SnapshotAgentProcess::~SnapshotAgentProcess() {
  try {
    stop();
  } catch (...) {
  }
}

int SnapshotAgentProcess::choose_index() {
  const int wanted = plan_.node;
  for (int node = wanted;;
       node = node == wanted ? std::max(wanted + 1, plan_.nnodes_max) : node + 1) {
    const int fd = checkpoint::take_agent_lock(plan_.job_id, node, kLockPatience);
    if (fd < 0) continue;
    if (node != wanted)
      std::fprintf(stderr,
                   "weft run: a live snapshot agent of job %s holds index %d on this machine; "
                   "this node's agent is named by index %d\n",
                   plan_.job_id.c_str(), wanted, node);
    plan_.node = node;
    plan_.socket = checkpoint::agent_socket_path(plan_.job_id, node);
    return fd;
  }
}

void SnapshotAgentProcess::spawn(int lock) {
  // An attempt that fails (its index held, no fork) counts as a quick death for keep_alive.
  started_s_ = now_s();
  if (lock < 0) lock = checkpoint::take_agent_lock(plan_.job_id, plan_.node, kLockPatience);
  if (lock < 0)
    throw IoError(str("another snapshot agent of job ", plan_.job_id, " holds index ", plan_.node,
                      " on this machine (", checkpoint::agent_lock_path(plan_.job_id, plan_.node),
                      "): a restarted agent keeps its index (it adopts the segments under it)"));
  // This process's copy of the lock goes whatever happens here: the agent's is the one held.
  struct CloseLock {
    int fd;
    ~CloseLock() { ::close(fd); }
  } close_lock{lock};
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  // weft run is the agent's guardian (keep_alive restarts it): named in its segments, it
  // keeps another job's agent from removing them between a kill and the restart.
  const pid_t parent = ::getpid();
  std::vector<std::string> args = {self_exe(),     "snapshot-agent",
                                   "--job",        plan_.job_id,
                                   "--node",       std::to_string(plan_.node),
                                   "--socket",     plan_.socket,
                                   "--guardian",   std::to_string(parent),
                                   "--redundancy", plan_.redundancy,
                                   "--lock-fd",    std::to_string(kAgentLockFd)};
  if (plan_.redundancy == "ec")
    args.insert(args.end(),
                {"--ec-k", std::to_string(plan_.ec_k), "--ec-m", std::to_string(plan_.ec_m)});
  if (!plan_.listen.empty()) args.insert(args.end(), {"--listen", plan_.listen});
  if (plan_.insecure) args.push_back("--insecure");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const long max_fd = std::min(::sysconf(_SC_OPEN_MAX), 65536L);  // close_range's fallback
  const pid_t pid = ::fork();
  if (pid < 0)
    throw IoError(str("weft run: cannot fork the snapshot agent: ", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);  // out of weft run's group: a Ctrl-C is weft run's to act on
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // weft run gone: exit, keeping the segments
    if (::getppid() != parent) ::_exit(1);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
    // The lock at a known number, kept across exec (dup2 clears close-on-exec; so does
    // fcntl when it is there already).
    if (lock == kAgentLockFd)
      ::fcntl(lock, F_SETFD, 0);
    else if (::dup2(lock, kAgentLockFd) < 0)
      ::_exit(126);
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    // The store's sockets, the workers' pipes: none of them is the agent's to hold open.
    bool closed = false;
#ifdef SYS_close_range
    closed = ::syscall(SYS_close_range, unsigned(kAgentLockFd) + 1, ~0U, 0) == 0;
#endif
    for (long fd = kAgentLockFd + 1; !closed && fd < max_fd; ++fd) ::close(int(fd));
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  pid_ = pid;
  ++generation_;
  std::fprintf(stderr,
               "weft run: started the snapshot agent (pid %d) for job %s on node %d at %s\n",
               int(pid), plan_.job_id.c_str(), plan_.node, plan_.socket.c_str());
}

bool SnapshotAgentProcess::wait_ready(double seconds) {
  const double until = now_s() + seconds;
  checkpoint::SnapshotAgentClient client(std::chrono::milliseconds(200));
  while (now_s() < until) {
    if (reap(false)) return false;
    try {
      client.connect(plan_.socket);
      return true;
    } catch (const IoError&) {
    }
  }
  return false;
}

bool SnapshotAgentProcess::reap(bool block) {
  if (pid_ <= 0) return true;
  int status = 0;
  pid_t r;
  do r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  if (r == pid_)
    std::fprintf(stderr, "weft run: the snapshot agent (pid %d) %s\n", int(pid_),
                 describe(status).c_str());
  pid_ = -1;
  return true;
}

void SnapshotAgentProcess::keep_alive() {
  if (given_up_ || !reap(false)) return;
  quick_deaths_ = now_s() - started_s_ < 2 ? quick_deaths_ + 1 : 0;
  if (quick_deaths_ >= 3) {
    given_up_ = true;
    std::fprintf(
        stderr,
        "weft run: the snapshot agent died within 2 s of each of its last 3 starts; not restarting "
        "it: the workers' snapshot calls fail for the rest of this attempt\n");
    return;
  }
  std::fprintf(stderr, "weft run: restarting the snapshot agent (it adopts its segments)\n");
  try {
    spawn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft run: cannot restart the snapshot agent: %s\n", e.what());
  }
}

void SnapshotAgentProcess::end_well(bool node_only) {
  if (pid_ <= 0) {  // died since the last tick: a fresh one adopts the segments to remove
    given_up_ = false;
    bool started = false;
    try {
      spawn();
      started = wait_ready(10);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "weft run: cannot start the snapshot agent again: %s\n", e.what());
    }
    if (!started) {
      std::fprintf(
          stderr,
          "weft run: the snapshot agent did not start to finish the job; its segments stay "
          "(`weft snapshot clean` removes them)\n");
      stop();
      return;
    }
  }
  try {
    checkpoint::SnapshotAgentClient client(std::chrono::milliseconds(10000));
    client.connect(plan_.socket);
    std::vector<std::string> removed = client.finish(plan_.job_id, node_only);
    std::fprintf(stderr, "weft run: %s; the snapshot agent removed its %zu segment(s)\n",
                 node_only ? "this node left the job" : "the job ended well", removed.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft run: the snapshot agent did not finish (%s); its segments stay\n",
                 e.what());
  }
  const double until = now_s() + 10;
  while (!reap(false) && now_s() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stop();  // only when it did not exit on its own
}

void SnapshotAgentProcess::stop() {
  if (pid_ > 0) {
    const pid_t pid = pid_;
    ::kill(pid, SIGTERM);
    const double until = now_s() + 5;
    while (!reap(false) && now_s() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (pid_ > 0) {
      ::kill(pid, SIGKILL);
      reap(true);
    }
    std::fprintf(stderr,
                 "weft run: stopped the snapshot agent (pid %d); its segments stay for a restart "
                 "of job %s\n",
                 int(pid), plan_.job_id.c_str());
  }
  // An agent that ended by itself removed its socket and lock; one killed (SIGKILL, or the
  // one given up on) left them, and no later agent of this job and node would reuse them.
  for (const std::string& path : checkpoint::remove_stale_agent_files(plan_.job_id, plan_.node))
    std::fprintf(stderr, "weft run: removed %s, left by a killed snapshot agent\n", path.c_str());
}

std::string SnapshotAgentProcess::endpoint() {
  if (plan_.listen.empty() || pid_ <= 0) return "";
  if (endpoint_of_ == generation_) return endpoint_;
  try {
    checkpoint::SnapshotAgentClient client(std::chrono::milliseconds(2000));
    client.connect(plan_.socket);
    endpoint_ = client.endpoint();
    endpoint_of_ = generation_;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft run: the snapshot agent did not say where its peers reach it: %s\n",
                 e.what());
    return "";
  }
  return endpoint_;
}

void SnapshotAgentProcess::peers(int64_t epoch, int node, const std::vector<std::string>& nodes) {
  checkpoint::SnapshotAgentClient client(std::chrono::milliseconds(2000));
  client.connect(plan_.socket);
  client.peers(plan_.job_id, epoch, node, nodes);
}

std::unique_ptr<SnapshotAgentProcess> start_snapshot_agent(const std::vector<std::string>& command,
                                                           const std::string& run_id, int node,
                                                           const SnapshotAgentSite& site) {
  std::optional<SnapshotAgentPlan> plan = snapshot_agent_plan(command, run_id, node);
  if (!plan) return nullptr;
  if (plan->redundancy == "replica") {
    if (site.nnodes_max < 2 || site.host.empty())
      throw ConfigError("snapshot.redundancy",
                        "replica needs at least 2 nodes: each node's snapshots are copied to the "
                        "next node's snapshot agent, and this job runs on one (weft run "
                        "--standalone, or --nnodes 1); use none (the node's own snapshots "
                        "survive any worker's crash), or run on 2 nodes or more");
  }
  if (plan->redundancy == "ec" &&
      (site.nnodes_max < plan->ec_k + plan->ec_m || site.host.empty()))
    throw ConfigError("snapshot.ec",
                      str("k=", plan->ec_k, ", m=", plan->ec_m, " needs at least k + m = ",
                          plan->ec_k + plan->ec_m,
                          " nodes (a stripe's fragments on distinct nodes), and this job runs on "
                          "at most ", site.host.empty() ? 1 : site.nnodes_max,
                          " (--nnodes MIN:MAX); lower k or m, run on more nodes, or use "
                          "snapshot.redundancy: replica"));
  plan->nnodes_max = site.nnodes_max;
  if (plan->redundancy != "none") {
    const bool v6 = site.host.find(':') != std::string::npos;
    plan->listen = (v6 ? "[" + site.host + "]" : site.host) + ":0";
    plan->insecure = site.insecure;
  }
  return std::make_unique<SnapshotAgentProcess>(std::move(*plan));
}

}  // namespace weft::launch
