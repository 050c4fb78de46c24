// weft run's agent loop: spawn, watch (exits, heartbeats, signals), stop, name the root cause.
#include "launch/supervisor.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "base/host.h"
#include "launch/epoch_notice.h"
#include "launch/error_file.h"
#include "launch/heartbeat.h"
#include "launch/scratch_dir.h"
#include "launch/worker_spawn.h"

namespace weft::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_interrupts = 0;  // Ctrl-C count
volatile std::sig_atomic_t g_stop_signal = 0;  // SIGTERM or SIGHUP
void on_signal(int s) {
  if (s == SIGINT) g_interrupts = g_interrupts + 1;
  else g_stop_signal = s;
}

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  std::unique_ptr<StreamSink> out, err;
  int beat_fd = -1;
  bool running = true;
  int status = 0;
  int64_t exit_ms = 0;
  bool beating = false;  // sent its first heartbeat: watched from now on
  Clock::duration beat_at{};   // the agent's watch clock (below) at its last beat
  bool starved_named = false;  // this silence was logged as starvation (heartbeat.h)
  bool hung = false;
  // Hung, killed by the agent, and to be replaced in place once reaped (o.replace): what
  // the agent saw ("sent no heartbeat for ...") and when.
  std::string hang;
  int64_t hang_ms = 0;
  int sent = 0;  // bit per signal the agent sent its group: 1 INT, 2 TERM, 4 KILL
  std::string error_file;
};

// One failure the root-cause summary may name.
struct Failure {
  int rank = -1;
  pid_t pid = -1;
  std::string host;
  int64_t ms = 0;
  std::string what;
  bool secondary = false;  // lost its peer or timed out waiting: follows another's failure
  std::string kind;        // its error file's kind (config, error, ...); "" without one
};

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + ::strsignal(WTERMSIG(status));
  return "stopped";
}

// Whether a worker's end is a failure of its own rather than the agent's doing.
bool failed_by_itself(const Worker& w) {
  if (WIFEXITED(w.status)) {
    int c = WEXITSTATUS(w.status);
    if (c == 0) return false;
    if (c == 130 && (w.sent & 3)) return false;  // weft train's clean stop on INT or TERM
    if (c == 128 + SIGTERM && (w.sent & 2)) return false;
    return !(c == 128 + SIGINT && (w.sent & 1));
  }
  if (!WIFSIGNALED(w.status)) return false;
  int s = WTERMSIG(w.status);
  return !((s == SIGINT && (w.sent & 1)) || (s == SIGTERM && (w.sent & 2)) ||
           (s == SIGKILL && (w.sent & 4)));
}

void signal_group(Worker& w, int sig) {
  if (!w.running) return;
  ::kill(-w.pid, sig);
  w.sent |= sig == SIGINT ? 1 : sig == SIGTERM ? 2 : sig == SIGKILL ? 4 : 0;
}

std::vector<std::pair<std::string, std::string>> worker_env(const SupervisorOptions& o, int rank,
                                                            const std::string& error_file) {
  std::string local = std::to_string(rank), lw = std::to_string(o.nproc);
  std::string r = std::to_string(o.node_index * o.nproc + rank);
  std::string n = std::to_string(o.nnodes * o.nproc);
  std::string port = std::to_string(o.store_port);
  std::vector<std::pair<std::string, std::string>> env = {
      {"WEFT_RANK", r}, {"WEFT_LOCAL_RANK", local}, {"WEFT_WORLD_SIZE", n},
      {"WEFT_STORE_ADDR", o.store_host + ":" + port}, {"WEFT_STORE_PREFIX", o.store_prefix},
      // torchrun's worker environment (one role)
      {"RANK", r}, {"LOCAL_RANK", local}, {"WORLD_SIZE", n}, {"LOCAL_WORLD_SIZE", lw},
      {"GROUP_RANK", std::to_string(o.node_index)}, {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_NAME", o.role}, {"ROLE_RANK", r}, {"ROLE_WORLD_SIZE", n}, {"MASTER_ADDR", o.store_host},
      {"MASTER_PORT", port}, {"TORCHELASTIC_RUN_ID", o.run_id},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(o.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"WEFT_RDZV_EPOCH", std::to_string(o.rdzv_epoch)},
      {"WEFT_NNODES", std::to_string(o.nnodes_min) + ":" + std::to_string(o.nnodes_max)},
      {kErrorFileVar, error_file}, {kHeartbeatFdVar, std::to_string(kWorkerBeatFd)}};
  char iv[32];
  std::snprintf(iv, sizeof iv, "%g", o.heartbeat_interval_s);
  env.push_back({kHeartbeatIntervalVar, iv});
  if (!o.epoch_file.empty()) env.push_back({kEpochFileVar, o.epoch_file});
  // Share the cores among the workers unless the user chose (torchrun sets 1): N workers
  // each running the OpenMP default of all cores oversubscribe them several times over.
  if (!std::getenv("OMP_NUM_THREADS")) {
    long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    env.push_back({"OMP_NUM_THREADS", std::to_string(std::max(1L, cores / o.nproc))});
  }
  return env;
}

std::set<int> console_ranks(const OutputOptions& o, int n) {
  std::set<int> out(o.local_ranks_filter.begin(), o.local_ranks_filter.end());
  if (o.local_ranks_filter.empty())
    for (int r = 0; r < n; ++r) out.insert(r);
  return out;
}

std::string make_temp(const char* prefix) {
  std::string t = (fs::temp_directory_path() / (std::string(prefix) + "XXXXXX")).string();
  if (!::mkdtemp(t.data())) throw IoError("weft run: cannot create a folder under " + t);
  return t;
}

// Which epoch notice a node's workers were sent last: the file's identity and mtime (the
// agent replaces it by rename, so a new notice is a new inode).
struct FileStamp {
  ino_t ino = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

std::optional<FileStamp> file_stamp(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{st.st_ino, int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

}  // namespace

bool stop_requested() { return g_interrupts > 0 || g_stop_signal != 0; }

Outcome supervise(const SupervisorOptions& o) {
  // Log folder: --log-dir, else a temporary one when --redirects/--tee need files; error
  // files live there too, or in a temporary folder removed at the end.
  std::string log_dir = o.output.log_dir;
  bool files_default = !log_dir.empty() && !o.output.redirects.any() && !o.output.tee.any();
  if (log_dir.empty() && (o.output.redirects.any() || o.output.tee.any())) {
    log_dir = make_temp("weft_run_logs_");
    std::fprintf(stderr, "weft run: worker logs in %s\n", log_dir.c_str());
  }
  std::optional<ScratchDir> scratch;  // the error files' folder when there is no log folder
  if (log_dir.empty()) scratch.emplace();
  const std::string err_root = scratch ? scratch->path() : log_dir;
  std::set<int> shown = console_ranks(o.output, o.nproc);
  auto global = [&](int local) { return o.node_index * o.nproc + local; };

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);  // no SA_RESTART
  std::signal(SIGPIPE, SIG_IGN);
  std::fflush(stdout);
  std::fflush(stderr);

  Guardian guardian;
  std::vector<Worker> workers(size_t(o.nproc));
  // Starts local rank r's worker in its slot: at the attempt's start, and again for a
  // replacement (o.replace), in the attempt folder of the options' restart count then.
  auto start_worker = [&](int r) {
    Worker& w = workers[size_t(r)];
    w = Worker{};
    w.rank = r;
    const std::string attempt = "attempt_" + std::to_string(o.restart_count);
    fs::path rank_dir = fs::path(err_root) / attempt / ("rank_" + std::to_string(r));
    fs::create_directories(rank_dir);
    w.error_file = (rank_dir / "error.json").string();
    fs::remove(w.error_file);
    int to_file = files_default ? 3 : o.output.redirects.of(r) | o.output.tee.of(r);
    int off_console = o.output.redirects.of(r);
    bool show = shown.count(r) > 0;
    std::string lf = log_dir.empty() ? "" : (fs::path(log_dir) / attempt / ("rank_" + std::to_string(r))).string();
    // Console prefixes and messages name the global rank (node_index * nproc + local).
    const int g = o.node_index * o.nproc + r;
    w.out = std::make_unique<StreamSink>(g, show && !(off_console & 1) ? stdout : nullptr,
                                         (to_file & 1) ? lf + "/stdout.log" : "");
    w.err = std::make_unique<StreamSink>(g, show && !(off_console & 2) ? stderr : nullptr,
                                         (to_file & 2) ? lf + "/stderr.log" : "");
    SpawnedWorker s = spawn_worker(o.command, worker_env(o, r, w.error_file));
    guardian.watch(s.pid);
    w.pid = s.pid;
    w.out->set_fd(s.out_fd);
    w.err->set_fd(s.err_fd);
    w.beat_fd = s.beat_fd;
  };
  for (int r = 0; r < o.nproc; ++r) start_worker(r);

  std::vector<Failure> failures;
  bool terminate_handled = false;  // on_terminate took the SIGTERM
  bool failing = false;  // stopping because a worker failed
  int forwarded = 0, agent_signal = 0;
  auto deadline = Clock::time_point::max();
  bool killed_all = false;
  auto stop_all = [&](int sig) {
    for (Worker& w : workers) signal_group(w, sig);
    deadline = std::min(deadline, Clock::now() + std::chrono::milliseconds(int64_t(o.grace_s * 1000)));
  };
  const auto hb_timeout = std::chrono::milliseconds(int64_t(o.heartbeat_timeout_s * 1000));
  const auto hb_interval = std::chrono::milliseconds(int64_t(o.heartbeat_interval_s * 1000));
  // The agent's watch clock: a worker's silence is measured on it, not on the wall clock. A
  // pass of the loop advances it by the time since the previous pass, but by no more than
  // that pass's poll wait and a few poll intervals of work: when the agent itself did not run
  // for longer (stopped with its workers, a VM paused or migrated, a host suspended, a cgroup
  // frozen, a machine so loaded that nothing ran), its workers may not have run either, and a
  // beat they could not send is no sign of a hang. Beats sent while the agent was away wait
  // in the socket and count when read, so the agent's absence only ever adds to a silence.
  Clock::duration watched{};
  const auto pass_work =
      std::chrono::milliseconds(std::max<int64_t>(4 * int64_t(o.poll_s * 1000), 50));
  auto last_pass = Clock::now();
  // Another node's verdict (monitor): lost or failed there. It is the root cause here.
  std::string remote;
  const auto monitor_every = std::chrono::milliseconds(int64_t(o.monitor_interval_s * 1000));
  auto next_monitor = Clock::now() + monitor_every;
  // After a worker's poke (a collective failed: a peer is gone), the monitor looks again at
  // once and then at growing gaps (5, 10, 20, 40, 80 ms) before its usual cadence: the lost
  // node's agent leaves the membership within milliseconds of its worker's death, and this
  // agent posts the new epoch as soon as it sees that. A pass that posted an epoch starts
  // the gaps over: failures come in bursts (several nodes' workers killed by one event, each
  // agent leaving when it has reaped its own). A few passes per failure, not a faster poll
  // for the whole job: the store's load stays what --monitor-interval makes it.
  int close_passes = 0;
  auto close_gap = std::chrono::milliseconds(5);
  auto watch_closely = [&](Clock::time_point from) {
    next_monitor = from;
    close_passes = 5;
    close_gap = std::chrono::milliseconds(5);
  };
  std::optional<FileStamp> posted = file_stamp(o.epoch_file);  // the last epoch notice seen

  for (;;) {
    if (g_interrupts > forwarded) {  // Ctrl-C: weft train stops after the step (each one)
      forwarded = g_interrupts;
      if (!agent_signal) agent_signal = SIGINT;
      stop_all(SIGINT);
    }
    if (g_stop_signal == SIGTERM && !agent_signal && !terminate_handled && o.on_terminate &&
        o.on_terminate()) {
      terminate_handled = true;  // the agent leaves gracefully; its workers end on their own
      // The leave is the monitor's to write: at once, not at its next pass (up to
      // --monitor-interval later, time the other nodes learn of it later).
      watch_closely(Clock::now());
    }
    if (g_stop_signal && agent_signal != g_stop_signal && agent_signal != SIGTERM &&
        agent_signal != SIGHUP && !(terminate_handled && g_stop_signal == SIGTERM)) {
      agent_signal = g_stop_signal;
      std::fprintf(stderr, "weft run: got %s; stopping the workers (SIGTERM, SIGKILL after %g s)\n",
                   agent_signal == SIGHUP ? "SIGHUP" : "SIGTERM", o.grace_s);
      stop_all(SIGTERM);
    }
    std::vector<pollfd> pfds;
    for (Worker& w : workers) {
      if (w.out->fd() >= 0) pfds.push_back({w.out->fd(), POLLIN, 0});
      if (w.err->fd() >= 0) pfds.push_back({w.err->fd(), POLLIN, 0});
      if (w.beat_fd >= 0) pfds.push_back({w.beat_fd, POLLIN, 0});
    }
    const bool wake_polled = o.monitor && o.wake_fd >= 0;
    if (wake_polled) pfds.push_back({o.wake_fd, POLLIN, 0});
    int wait_ms = std::max(1, int(o.poll_s * 1000));
    if (o.monitor && close_passes > 0)  // a close look is due sooner than the next poll
      wait_ms = std::clamp(int(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   next_monitor - Clock::now()).count()),
                           1, wait_ms);
    ::poll(pfds.data(), pfds.size(), wait_ms);
    auto now = Clock::now();
    {
      const Clock::duration gap = now - last_pass;
      const Clock::duration counted =
          std::min(gap, Clock::duration(std::chrono::milliseconds(wait_ms) + pass_work));
      last_pass = now;
      watched += counted;
      if (o.heartbeat_timeout_s > 0 && gap - counted >= hb_interval && !failing && !agent_signal) {
        std::fprintf(stderr,
                     "weft run: this agent did not run for %.1f s (stopped, suspended, starved of "
                     "CPU or blocked); its workers' silence in that time is not counted\n",
                     std::chrono::duration<double>(gap - counted).count());
        std::fflush(stderr);
      }
    }
    if (wake_polled && (pfds.back().revents & POLLIN)) {
      uint64_t n = 0;
      (void)!::read(o.wake_fd, &n, sizeof n);
      next_monitor = std::min(next_monitor, now);  // the membership changed: look now
    }
    for (Worker& w : workers) {
      w.out->pump();
      w.err->pump();
      if (w.beat_fd >= 0) {
        char buf[256];
        ssize_t k;
        while ((k = ::read(w.beat_fd, buf, sizeof buf)) > 0) {
          w.beating = true, w.beat_at = watched, w.starved_named = false;
          if (std::memchr(buf, kPokeByte, size_t(k))) {
            if (o.monitor && close_passes == 0 && !failing && !agent_signal) {
              std::fprintf(stderr, "weft run: rank %d lost a peer; looking at the membership now\n",
                           global(w.rank));
              std::fflush(stderr);
            }
            watch_closely(now);
          }
        }
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
          ::close(w.beat_fd);  // the worker (and its children) closed it
          w.beat_fd = -1;
        }
      }
    }
    // Reap every worker that ended before deciding anything, so that failures seen in the
    // same pass are all candidates for the root cause.
    bool new_failure = false;
    std::vector<int> replaced;  // local ranks the agent replaces in place (o.replace)
    for (Worker& w : workers) {
      if (!w.running || ::waitpid(w.pid, &w.status, WNOHANG) != w.pid) continue;
      w.running = false;
      w.exit_ms = now_ms();
      ::kill(-w.pid, SIGKILL);  // what it left in its group does not outlive it
      guardian.release(w.pid);
      const bool hung = !w.hang.empty();  // killed by the agent for its silence
      if (!hung && (w.hung || !failed_by_itself(w))) continue;
      const std::string what = hung ? w.hang : describe(w.status);
      if (o.replace && !failing && !agent_signal && remote.empty() && !new_failure) {
        std::optional<ErrorRecord> e = read_error_file(w.error_file);
        std::string cause =
            str("rank ", global(w.rank), " (pid ", w.pid, ", host ", host_name(), ") ", what);
        if (hung) cause += "; killed";
        else if (e && !e->message.empty()) cause += ": " + e->message;
        if (o.replace(w.rank, cause)) {
          replaced.push_back(w.rank);
          continue;
        }
      }
      failures.push_back({w.rank, w.pid, host_name(), hung ? w.hang_ms : w.exit_ms, what, false});
      if (!failing && agent_signal != SIGTERM && agent_signal != SIGHUP)
        std::fprintf(stderr, "weft run: rank %d %s; stopping the other workers\n", global(w.rank),
                     what.c_str());
      new_failure = true;
    }
    // The others go on: what the dead worker wrote is taken, and a new one takes its slot.
    for (int r : replaced) {
      Worker& w = workers[size_t(r)];
      w.out->finish();
      w.err->finish();
      if (w.beat_fd >= 0) ::close(w.beat_fd);
      start_worker(r);
      std::fprintf(stderr, "weft run: rank %d: a replacement worker (pid %d) joins epoch %lld\n",
                   global(r), int(w.pid), (long long)o.rdzv_epoch);
      std::fflush(stderr);
    }
    if (o.heartbeat_timeout_s > 0 && !failing && !agent_signal)
      for (Worker& w : workers) {
        if (!w.running || !w.beating || w.hung || watched - w.beat_at <= hb_timeout) continue;
        double quiet = std::chrono::duration<double>(watched - w.beat_at).count();
        // A beat thread that is runnable but silent this long waits for a CPU: the worker is
        // starved, not hung (a stopped one's thread is T, a frozen or blocked one's S or D, a
        // dead one's gone). It is looked at again at every pass and killed once it is not.
        if (heartbeat_thread_runnable(w.pid)) {
          if (!w.starved_named)
            std::fprintf(stderr,
                         "weft run: rank %d (pid %d) sent no heartbeat for %.1f s, but its "
                         "heartbeat thread is runnable (waiting for a CPU): starved, not hung; "
                         "still watching it\n",
                         global(w.rank), int(w.pid), quiet);
          w.starved_named = true;
          continue;
        }
        char what[160];
        std::snprintf(what, sizeof what, "sent no heartbeat for %.1f s: hung or stopped", quiet);
        w.hung = true;
        // SIGKILL: a hung or stopped process may not act on SIGTERM. With in-place
        // replacement the agent decides once it is reaped (its slot must be free), as for a
        // worker that died; otherwise the job stops now.
        signal_group(w, SIGKILL);
        if (o.replace && remote.empty()) {
          std::fprintf(stderr, "weft run: rank %d (pid %d) %s; killing it (SIGKILL)\n",
                       global(w.rank), int(w.pid), what);
          w.hang = what;
          w.hang_ms = now_ms();
          continue;
        }
        std::fprintf(stderr, "weft run: rank %d (pid %d) %s; stopping the job\n", global(w.rank),
                     int(w.pid), what);
        failures.push_back({w.rank, w.pid, host_name(), now_ms(), what, false});
        new_failure = true;
      }
    if (o.monitor && remote.empty() && !failing && !agent_signal && now >= next_monitor) {
      remote = o.monitor();
      const std::optional<FileStamp> now_posted = file_stamp(o.epoch_file);
      const bool new_epoch = now_posted != posted;
      posted = now_posted;
      if (close_passes > 0 && new_epoch) {
        watch_closely(Clock::now() + std::chrono::milliseconds(5));
      } else if (close_passes > 0) {
        --close_passes;
        next_monitor = Clock::now() + close_gap;
        close_gap *= 2;
      } else {
        next_monitor = Clock::now() + monitor_every;
      }
      if (!remote.empty()) {
        const bool loss = o.verdict_is_loss && o.verdict_is_loss();
        std::fprintf(stderr, "weft run: %s; stopping the workers%s\n", remote.c_str(),
                     loss ? " (SIGKILL: their world lost a member, so their step cannot end)"
                          : "");
        stop_all(loss ? SIGKILL : SIGTERM);
      }
    }
    if (new_failure && !failing) {
      failing = true;
      stop_all(SIGTERM);
    }
    if (!killed_all && Clock::now() > deadline) {
      killed_all = true;
      for (Worker& w : workers) signal_group(w, SIGKILL);
    }
    bool any_running = false, any_open = false;
    for (Worker& w : workers) {
      any_running = any_running || w.running;
      any_open = any_open || w.out->fd() >= 0 || w.err->fd() >= 0;
    }
    if (!any_running) {  // take what is left; a pipe an escaped grandchild holds is closed
      for (Worker& w : workers) {
        w.out->finish();
        w.err->finish();
        if (w.beat_fd >= 0) ::close(w.beat_fd);
        w.beat_fd = -1;
      }
      break;
    }
    (void)any_open;
  }

  auto remote_verdict = [&] {
    if (agent_signal) return Outcome{Outcome::End::kSignalled, 128 + agent_signal, remote, remote};
    return Outcome{Outcome::End::kStopped, 1, remote, remote};
  };
  // Set only while nothing failed here: what fails after it follows from it.
  if (!remote.empty()) return remote_verdict();
  if (failures.empty()) {
    if (agent_signal) return Outcome{Outcome::End::kSignalled, 128 + agent_signal, "", ""};
    return Outcome{};
  }

  // The root cause: the earliest failure of a rank's own; a rank that lost its peer or
  // timed out waiting for it is named only when nothing else failed.
  for (Worker& w : workers) {
    std::optional<ErrorRecord> e = read_error_file(w.error_file);
    if (!e) continue;
    Failure f{w.rank, w.pid, e->host.empty() ? host_name() : e->host,
              e->time_ms ? e->time_ms : w.exit_ms, e->message,
              e->kind == "peer_lost" || e->kind == "timeout", e->kind};
    auto it = std::find_if(failures.begin(), failures.end(),
                           [&](const Failure& x) { return x.rank == w.rank; });
    if (it != failures.end()) *it = f;
    else failures.push_back(f);
  }
  auto first = std::min_element(failures.begin(), failures.end(), [](const Failure& a, const Failure& b) {
    return std::make_pair(a.secondary, a.ms) < std::make_pair(b.secondary, b.ms);
  });
  // A rank here that only lost its peer, on several nodes: the cause may be another node
  // (lost, or failed and closing the job); give the monitor the time to learn it.
  if (o.monitor && first->secondary && remote.empty() && !agent_signal) {
    const auto until = Clock::now() + std::chrono::milliseconds(int64_t(o.settle_s * 1000));
    while (remote.empty() && Clock::now() < until) {
      remote = o.monitor();
      if (remote.empty()) std::this_thread::sleep_for(monitor_every);
    }
    if (!remote.empty()) return remote_verdict();
  }
  const Worker& root = workers[size_t(first->rank)];
  Outcome out;
  out.end = agent_signal ? Outcome::End::kSignalled : Outcome::End::kFailed;
  out.cause = str("rank ", global(first->rank), " (pid ", first->pid, ", host ", first->host,
                  ") failed: ", first->what);
  std::fprintf(stderr, "weft run: root cause: rank %d (pid %d, host %s) failed first at %s: %s\n",
               global(first->rank), int(first->pid), first->host.c_str(), format_time_ms(first->ms).c_str(),
               first->what.c_str());
  // A rank that had recorded its error may still have been exiting (slowly: a sanitizer's
  // teardown) when another rank's exit made us stop the job: its own error decides the code.
  const bool exited_itself = WIFEXITED(root.status) && WEXITSTATUS(root.status) != 0;
  const int own_code = exited_itself ? WEXITSTATUS(root.status) : first->kind == "config" ? 2 : 1;
  if (root.hung)
    out.verdict = str("rank ", global(root.rank), " hung (no heartbeat)");
  else if (!exited_itself && !first->kind.empty())
    out.verdict = str("rank ", global(root.rank), " (its error above; stopped while exiting)");
  else if (WIFSIGNALED(root.status))
    out.verdict = str("lost rank ", global(root.rank), " (it ", describe(root.status), ")");
  else
    out.verdict = str("rank ", global(root.rank), " ", describe(root.status));
  out.code = agent_signal == SIGTERM || agent_signal == SIGHUP ? 128 + agent_signal : own_code;
  return out;
}

}  // namespace weft::launch
