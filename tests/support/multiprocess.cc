// run_ranks(): fork a store server process and N rank processes, collect each rank's report
// through a pipe and its wait status, kill what outlives the deadline, and reap everything.
#include "tests/support/multiprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "base/check.h"
#include "base/error.h"
#include "base/log.h"
#include "comm/registry.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"

namespace weft::test {
namespace {

using Clock = std::chrono::steady_clock;

// First byte of a rank's report: it finished fn (and says how), anything else is a crash.
constexpr char kReportOk = 'K';
constexpr char kReportFailed = 'F';
constexpr int kExitFailed = 101;
// Reports are capped below a pipe's capacity so a child never blocks writing one.
constexpr size_t kMaxReport = 16 << 10;
constexpr int kPollMs = 10;

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reads what is available without blocking; returns false at EOF (or on error).
bool drain(int fd, std::string& into) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
}

pid_t waitpid_retry(pid_t pid, int* status, int flags) {
  pid_t r;
  do {
    r = ::waitpid(pid, status, flags);
  } while (r < 0 && errno == EINTR);
  return r;
}

// Every child dies with the parent, so a crashed test binary leaves no stray ranks.
void die_with_parent(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(kExitFailed);
}

// Failures GoogleTest recorded in this process since part `first` of the current test:
// EXPECT/ASSERT inside a rank land in the child's copy of the test result, which the
// parent never sees, so they travel back in the report.
std::string gtest_failures_since(int first) {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  if (!info) return {};
  const testing::TestResult* result = info->result();
  std::string out;
  for (int i = first; i < result->total_part_count(); ++i) {
    const testing::TestPartResult& part = result->GetTestPartResult(i);
    if (!part.failed()) continue;
    out += str(part.file_name() ? part.file_name() : "?", ":", part.line_number(), ": ",
               part.message(), "\n");
  }
  return out;
}

int gtest_part_count() {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  return info ? info->result()->total_part_count() : 0;
}

[[noreturn]] void run_child(int rank, int world, uint16_t port, const RunOptions& options,
                            const std::function<void(RankContext&)>& fn, int report_fd) {
  log_set_rank(rank);
  std::string report;
  int code = 0;
  try {
    RankContext ctx(rank, world, "127.0.0.1", port, options.store_timeout);
    int first = gtest_part_count();
    fn(ctx);
    std::string failures = gtest_failures_since(first);
    report = failures.empty() ? std::string(1, kReportOk) : kReportFailed + failures;
  } catch (const std::exception& e) {
    report = kReportFailed + std::string(e.what());
  } catch (...) {
    report = kReportFailed + std::string("unknown exception (not a std::exception)");
  }
  if (report[0] == kReportFailed) code = kExitFailed;
  if (report.size() > kMaxReport) report.resize(kMaxReport);
  write_all(report_fd, report);
  ::close(report_fd);
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);  // not exit(): the parent's atexit handlers and gtest teardown must not run here
}

// The store lives in its own process: the parent stays free of threads, so forking ranks
// from it cannot copy a lock some server thread held at that moment.
struct StoreProcess {
  pid_t pid = -1;
  int lifeline = -1;  // the server stops when this write end closes (or the parent dies)
  uint16_t port = 0;
};

StoreProcess start_store(pid_t parent) {
  int port_pipe[2], life[2];
  if (::pipe2(port_pipe, O_CLOEXEC) != 0 || ::pipe2(life, O_CLOEXEC) != 0)
    throw CommError(str("run_ranks: pipe: ", std::strerror(errno)));
  pid_t pid = ::fork();
  if (pid < 0) throw CommError(str("run_ranks: fork: ", std::strerror(errno)));
  if (pid == 0) {
    die_with_parent(parent);
    ::close(port_pipe[0]);
    ::close(life[1]);
    try {
      comm::TCPStoreServer server(comm::TCPStoreServerOptions{.host = "127.0.0.1", .port = 0});
      uint16_t port = server.port();
      write_all(port_pipe[1], std::string(reinterpret_cast<const char*>(&port), sizeof port));
      ::close(port_pipe[1]);
      for (;;) {  // until EOF: the parent closed the lifeline or died
        char c;
        ssize_t n = ::read(life[0], &c, 1);
        if (n > 0 || (n < 0 && errno == EINTR)) continue;
        break;
      }
      server.stop();
    } catch (const std::exception& e) {
      WEFT_WARN("test", "run_ranks: store server failed: ", e.what());
      ::_exit(kExitFailed);
    }
    ::_exit(0);
  }
  ::close(port_pipe[1]);
  ::close(life[0]);
  StoreProcess sp{pid, life[1], 0};
  pollfd p{port_pipe[0], POLLIN, 0};
  std::string got;
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (got.size() < sizeof(uint16_t) && Clock::now() < deadline) {
    if (::poll(&p, 1, 100) > 0) {
      char buf[2];
      ssize_t n = ::read(port_pipe[0], buf, sizeof buf - got.size());
      if (n == 0) break;
      if (n > 0) got.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(port_pipe[0]);
  if (got.size() != sizeof(uint16_t)) {
    ::close(sp.lifeline);
    ::kill(pid, SIGKILL);
    waitpid_retry(pid, nullptr, 0);
    throw CommError("run_ranks: the store server process did not report its port");
  }
  std::memcpy(&sp.port, got.data(), sizeof sp.port);
  return sp;
}

void stop_store(StoreProcess& sp) {
  if (sp.pid < 0) return;
  ::close(sp.lifeline);
  // It stops by itself once the lifeline closes; SIGKILL only if it does not.
  auto deadline = Clock::now() + std::chrono::seconds(10);
  int status;
  while (waitpid_retry(sp.pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      ::kill(sp.pid, SIGKILL);
      waitpid_retry(sp.pid, &status, 0);
      break;
    }
    ::usleep(kPollMs * 1000);
  }
  sp.pid = -1;
}

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of the report pipe
  std::string report;
  bool reaped = false;
  bool killed = false;
  int status = 0;
};

// Kills and reaps whatever is left when run_ranks unwinds by an exception.
struct Reaper {
  std::vector<Child>& children;
  StoreProcess& store;
  ~Reaper() {
    for (auto& c : children) {
      if (c.pid > 0 && !c.reaped) {
        ::kill(c.pid, SIGKILL);
        waitpid_retry(c.pid, &c.status, 0);
        c.reaped = true;
      }
      if (c.fd >= 0) ::close(c.fd);
      c.fd = -1;
    }
    stop_store(store);
  }
};

RankOutcome outcome_of(int rank, const Child& c, std::chrono::milliseconds deadline) {
  RankOutcome o;
  o.rank = rank;
  bool finished = !c.report.empty() && c.report[0] == kReportOk;
  bool failed = !c.report.empty() && c.report[0] == kReportFailed;
  if (failed) o.message = c.report.substr(1);
  if (WIFEXITED(c.status)) {
    o.exit_code = WEXITSTATUS(c.status);
    if (failed)
      o.status = RankStatus::kFailed;
    else if (finished && o.exit_code == 0)
      o.status = RankStatus::kOk;
    else {
      o.status = RankStatus::kExited;
      o.message = str("exited with code ", o.exit_code, " before its function returned");
    }
  } else if (WIFSIGNALED(c.status)) {
    o.signal = WTERMSIG(c.status);
    if (c.killed && o.signal == SIGKILL) {
      o.status = RankStatus::kTimedOut;
      o.message =
          str("still running at the deadline (", deadline.count(), " ms); killed with SIGKILL");
    } else {
      o.status = RankStatus::kSignaled;
      o.message = str("killed by signal ", o.signal, " (", ::strsignal(o.signal), ")");
    }
  }
  return o;
}

}  // namespace

std::unique_ptr<comm::Store> RankContext::store() const {
  return std::make_unique<comm::TCPStore>(store_host_, store_port_, store_timeout_);
}

const char* to_string(RankStatus s) {
  switch (s) {
    case RankStatus::kOk:
      return "ok";
    case RankStatus::kFailed:
      return "failed";
    case RankStatus::kExited:
      return "exited";
    case RankStatus::kSignaled:
      return "signaled";
    case RankStatus::kTimedOut:
      return "timed out";
  }
  return "?";
}

bool RunResult::ok() const {
  for (const auto& r : ranks)
    if (!r.ok()) return false;
  return !ranks.empty();
}

std::string RunResult::summary() const {
  if (ok()) return str("all ", ranks.size(), " ranks ok");
  std::string s;
  for (const auto& r : ranks)
    if (!r.ok()) s += str("rank ", r.rank, ": ", to_string(r.status), ": ", r.message, "\n");
  return s.empty() ? "no ranks ran" : s;
}

RunResult run_ranks(int world, const std::function<void(RankContext&)>& fn,
                    const RunOptions& options) {
  WEFT_CHECK(world > 0, "run_ranks: world must be positive, got ", world);
  const pid_t parent = ::getpid();
  // Buffered output would otherwise be written once by the parent and once per child.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);

  std::vector<Child> children(static_cast<size_t>(world));
  StoreProcess store = start_store(parent);
  Reaper reaper{children, store};
  const auto deadline = Clock::now() + options.deadline;

  for (int r = 0; r < world; ++r) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      throw CommError(str("run_ranks: pipe: ", std::strerror(errno)));
    pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw CommError(str("run_ranks: fork: ", std::strerror(errno)));
    }
    if (pid == 0) {
      die_with_parent(parent);
      ::close(fds[0]);
      ::close(store.lifeline);
      for (auto& c : children)
        if (c.fd >= 0) ::close(c.fd);
      run_child(r, world, store.port, options, fn, fds[1]);
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    children[r].pid = pid;
    children[r].fd = fds[0];
  }

  int running = world;
  while (running > 0) {
    std::vector<pollfd> fds;
    for (auto& c : children)
      if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
    if (!fds.empty())
      ::poll(fds.data(), fds.size(), kPollMs);
    else
      ::usleep(kPollMs * 1000);
    for (auto& c : children) {
      if (c.fd >= 0 && !drain(c.fd, c.report)) {
        ::close(c.fd);
        c.fd = -1;
      }
      if (!c.reaped && waitpid_retry(c.pid, &c.status, WNOHANG) == c.pid) {
        c.reaped = true;
        --running;
      }
    }
    if (running > 0 && Clock::now() >= deadline) {
      for (auto& c : children)
        if (!c.reaped) {
          c.killed = true;
          ::kill(c.pid, SIGKILL);
        }
      for (auto& c : children)
        if (!c.reaped) {
          waitpid_retry(c.pid, &c.status, 0);
          c.reaped = true;
        }
      running = 0;
    }
  }
  // The children are gone; take what their pipes still hold (a grandchild that kept a
  // write end open cannot make this block: the read ends are non-blocking).
  for (auto& c : children)
    if (c.fd >= 0) {
      drain(c.fd, c.report);
      ::close(c.fd);
      c.fd = -1;
    }

  RunResult result;
  for (int r = 0; r < world; ++r)
    result.ranks.push_back(outcome_of(r, children[r], options.deadline));
  return result;  // the Reaper stops the store process
}

RankWorld gloo_world(const RankContext& ctx, const std::string& prefix,
                     std::chrono::milliseconds timeout, int rank, int size) {
  RankWorld w;
  w.store = ctx.store();
  comm::CommOptions co;
  co.rank = rank < 0 ? ctx.rank() : rank;
  co.size = size < 0 ? ctx.world() : size;
  co.store = w.store.get();
  co.prefix = prefix;
  co.timeout = timeout;
  w.comm = comm::make_communicator(comm::BackendKind::kGloo, co);
  return w;
}

}  // namespace weft::test
