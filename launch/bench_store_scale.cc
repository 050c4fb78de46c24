// `weft bench store`: the rendezvous store under 1K-10K authenticated clients. The store runs
// in a child process (as a job's agent or `weft store` hosts it), the clients in this one on a
// few threads (launch/store_fleet.h); each process needs one open file per client.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store_server.h"
#include "launch/args.h"
#include "launch/bench_store.h"
#include "launch/store_fleet.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp =
    "usage: weft bench store [--clients 1000,10000] [--seconds S] [--load-clients N]\n"
    "                        [--threads T] [--scenarios rendezvous,load] [--timeout-s S]\n"
    "  The rendezvous store (one TCPStoreServer, in a child process on 127.0.0.1) under many\n"
    "  clients, each proving a fresh job token (the HMAC handshake) as workers do.\n"
    "  rendezvous: N clients connect and ping, set their key, add to a counter, wait for the\n"
    "    barrier key the last arrival sets, get a peer's key and disconnect, so all N are\n"
    "    connected at once. Wall time from the first connect to the last client done, connect\n"
    "    p50/p99, and the rate against PyTorch's libuv TCPStore (96K clients in about 100 s).\n"
    "  load: ops/s and latency of set, get and add, each client one request in flight.\n"
    "  --clients N,...    rendezvous sizes (default 1000,10000)\n"
    "  --seconds S        per op in the load scenario (default 1)\n"
    "  --load-clients N   clients of the load scenario (default 1000)\n"
    "  --threads T        threads driving the clients, asynchronously (default 1)\n"
    "  --scenarios LIST   rendezvous, load, or both (default)\n"
    "  --timeout-s S      bound on each scenario (default 120)\n"
    "  Each process holds one socket per client: the soft RLIMIT_NOFILE is raised to the hard\n"
    "  limit, and a count that does not fit is refused, naming the limit.\n";

// Files a process holds besides its sockets (stdio, epoll, pipes, libraries).
constexpr long kSpareFiles = 64;
// PyTorch's libuv TCPStore: 96K clients initialised in about 100 s (pytorch/tutorials PR
// #2966, quoted in design/anchors/elastic.md section 3.5).
constexpr double kTorchClients = 96'000, kTorchSeconds = 100;

std::vector<int> int_list(const std::string& opt, const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 1)
      throw ConfigError(opt, "expected positive integers separated by commas, got '" + s + "'");
    out.push_back(v);
  }
  if (out.empty()) throw ConfigError(opt, "expected at least one count");
  return out;
}

double positive_seconds(const Args& a, const std::string& opt, double fallback) {
  if (!a.has(opt)) return fallback;
  double v = 0;
  size_t used = 0;
  try {
    v = std::stod(a.get(opt), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != a.get(opt).size() || !(v > 0))
    throw ConfigError(opt, "expected a positive number of seconds, got '" + a.get(opt) + "'");
  return v;
}

// Raises the soft RLIMIT_NOFILE to the hard one; returns the limit in effect.
long raise_open_files() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t want = rl.rlim_max;
    rl.rlim_cur = want;
    ::setrlimit(RLIMIT_NOFILE, &rl);
    ::getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur == RLIM_INFINITY ? (1L << 30) : long(rl.rlim_cur);
}

// Refuses a client count that this machine's limits cannot hold, naming the limit.
void check_limits(int clients, long open_files) {
  if (clients + kSpareFiles > open_files)
    throw ConfigError(
        "--clients",
        str(clients, " clients need about ", clients + kSpareFiles,
            " open files in this process and as many in the store's (a child process), but "
            "RLIMIT_NOFILE (ulimit -n) allows at most ",
            open_files,
            " here, already raised to its hard limit: raise the hard limit (`ulimit -Hn` as "
            "root, /etc/security/limits.conf, LimitNOFILE= under systemd) or use at most ",
            open_files - kSpareFiles, " clients"));
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  long lo = 0, hi = 0;
  if (range >> lo >> hi && clients > hi - lo + 1)
    throw ConfigError("--clients", str(clients,
                                       " clients need as many local ports, but "
                                       "net.ipv4.ip_local_port_range has ",
                                       hi - lo + 1, " (", lo, "-", hi, ")"));
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n) {
    ssize_t got = ::read(fd, b, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    b += got, n -= size_t(got);
  }
  return true;
}

void write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n) {
    ssize_t put = ::write(fd, b, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return;
    b += put, n -= size_t(put);
  }
}

// The store under test in a forked child: its sockets count against its own RLIMIT_NOFILE,
// and its thread shares no process with the client threads. Fork only while this process
// has no other threads. The child dies with the parent (PR_SET_PDEATHSIG).
class ServerProcess {
 public:
  explicit ServerProcess(const std::string& token) {
    int up[2], down[2];  // child -> parent, parent -> child
    if (::pipe2(up, O_CLOEXEC) != 0) throw IoError(str("pipe: ", std::strerror(errno)));
    if (::pipe2(down, O_CLOEXEC) != 0) {
      ::close(up[0]), ::close(up[1]);
      throw IoError(str("pipe: ", std::strerror(errno)));
    }
    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw IoError(str("fork: ", std::strerror(errno)));
    if (pid_ == 0) {
      ::close(up[0]), ::close(down[1]);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      serve(token, up[1], down[0]);
    }
    ::close(up[1]), ::close(down[0]);
    from_ = up[0], to_ = down[1];
    Hello h{};
    if (!read_all(from_, &h, sizeof h))
      throw CommError("bench store: the store process exited before it listened");
    if (h.error[0]) throw CommError(std::string("bench store: the store failed: ") + h.error);
    port_ = h.port;
  }
  ~ServerProcess() {
    if (pid_ <= 0) return;
    ::close(to_), ::close(from_);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  uint16_t port() const { return port_; }
  // The server's counters; then it stops and exits.
  comm::TCPStoreServerStats finish() {
    comm::TCPStoreServerStats s{};
    char c = 's';
    write_all(to_, &c, 1);
    bool ok = read_all(from_, &s, sizeof s);
    ::close(to_), ::close(from_);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    if (!ok) throw CommError("bench store: the store process exited before reporting");
    return s;
  }

 private:
  struct Hello {
    uint16_t port;
    char error[512];
  };
  [[noreturn]] static void serve(const std::string& token, int up, int down) {
    Hello h{};
    try {
      comm::TCPStoreServerOptions o;
      o.host = "127.0.0.1";
      o.token = token;
      comm::TCPStoreServer server(o);
      h.port = server.port();
      write_all(up, &h, sizeof h);
      char c = 0;
      bool asked = read_all(down, &c, 1);  // or EOF: the parent is gone
      comm::TCPStoreServerStats s = server.stats();
      if (asked) write_all(up, &s, sizeof s);
      server.stop();
      ::_exit(0);
    } catch (const std::exception& e) {
      std::snprintf(h.error, sizeof h.error, "%s", e.what());
      write_all(up, &h, sizeof h);
      ::_exit(1);
    }
  }

  pid_t pid_ = -1;
  int from_ = -1, to_ = -1;
  uint16_t port_ = 0;
};

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double one = 0;
  return in >> one ? str(one) : std::string("?");
}

struct RendezvousRow {
  RendezvousResult r;
  comm::TCPStoreServerStats server;
};

void print_rendezvous(const std::vector<RendezvousRow>& rows) {
  std::printf(
      "\n== rendezvous: each client connects + proves the token + pings, sets its key, adds to a "
      "counter, waits for the barrier key, gets a peer's key, disconnects ==\n");
  std::printf("%7s | %9s %9s %9s | %9s %9s %9s | %9s | %8s %8s %8s | %7s\n", "clients", "completed",
              "peak conn", "srv peak", "all conn", "barrier", "wall s", "clients/s", "conn p50",
              "p99 ms", "max ms", "retries");
  for (const RendezvousRow& row : rows) {
    const RendezvousResult& r = row.r;
    std::printf("%7d | %9d %9d %9llu | %9.3f %9.3f %9.3f | %9.0f | %8.2f %8.2f %8.2f | %7d\n",
                r.clients, r.completed, r.peak_connected,
                (unsigned long long)row.server.connections_open_peak, r.all_connected_s,
                r.barrier_s, r.wall_s, r.wall_s > 0 ? r.clients / r.wall_s : 0.0, r.connect_p50_ms,
                r.connect_p99_ms, r.connect_max_ms, r.connect_retries);
  }
  std::printf(
      "all conn / barrier / wall s: seconds from the first connect until the last client was "
      "connected, the barrier key was set, the last client was done; peak conn: authenticated "
      "connections open at once (clients' count), srv peak: the server's\n");
  for (const RendezvousRow& row : rows) {
    const RendezvousResult& r = row.r;
    std::printf("rendezvous of %d clients: completed %d of %d%s%s\n", r.clients, r.completed,
                r.clients, r.error.empty() ? "" : ", failed: ", r.error.c_str());
  }
  const double torch_rate = kTorchClients / kTorchSeconds;
  std::printf(
      "\nvs PyTorch's libuv TCPStore: %.0fK clients in about %.0f s, %.0f clients/s "
      "(pytorch/tutorials PR #2966, quoted in design/anchors/elastic.md 3.5)\n",
      kTorchClients / 1000, kTorchSeconds, torch_rate);
  for (const RendezvousRow& row : rows) {
    const RendezvousResult& r = row.r;
    if (r.wall_s <= 0) continue;
    std::printf("  weft, %6d clients: %8.0f clients/s = %6.1fx that rate\n", r.clients,
                r.clients / r.wall_s, r.clients / r.wall_s / torch_rate);
  }
  std::printf(
      "  (not like for like: theirs is 96K processes on a cluster, ours N connections over "
      "loopback on this one machine, store and clients sharing its cores)\n");
}

void print_load(const std::vector<StoreSample>& samples, double seconds) {
  std::printf(
      "\n== load: every client connected and authenticated, each issuing one op back to back "
      "(one in flight) for %.2f s; set/get on its own key, add on one shared counter ==\n",
      seconds);
  std::printf("%7s %4s | %9s %9s | %9s\n", "clients", "op", "p50 us", "p99 us", "ops/s");
  for (const StoreSample& s : samples)
    std::printf("%7d %4s | %9.1f %9.1f | %9.0f\n", s.clients, s.op.c_str(), s.p50_us, s.p99_us,
                s.ops_per_s);
}

}  // namespace

int run_store_benchmark(const std::vector<std::string>& args) {
  for (const std::string& s : args)
    if (s == "--help" || s == "-h") return std::fputs(kHelp, stdout), 0;
  Args a(args,
         {"--clients", "--seconds", "--load-clients", "--threads", "--scenarios", "--timeout-s"});
  std::vector<int> sizes = int_list("--clients", a.get_or("--clients", "1000,10000"));
  const int load_clients = int_list("--load-clients", a.get_or("--load-clients", "1000"))[0];
  const int threads = int_list("--threads", a.get_or("--threads", "1"))[0];
  const double seconds = positive_seconds(a, "--seconds", 1);
  const double timeout_s = positive_seconds(a, "--timeout-s", 120);
  bool rendezvous = false, load = false;
  std::stringstream list(a.get_or("--scenarios", "rendezvous,load"));
  for (std::string s; std::getline(list, s, ',');) {
    if (s == "rendezvous")
      rendezvous = true;
    else if (s == "load")
      load = true;
    else
      throw ConfigError("--scenarios", "unknown scenario '" + s + "'; expected rendezvous, load");
  }

  const long open_files = raise_open_files();
  if (rendezvous)
    for (int n : sizes) check_limits(n, open_files);
  if (load) check_limits(load_clients, open_files);

  FleetOptions o;
  o.token = comm::auth::generate_token();  // as `weft run` makes one per job
  o.threads = threads;
  o.timeout = comm::Millis(int64_t(timeout_s * 1000));
  std::printf(
      "weft bench store: store = one TCPStoreServer (one Asio thread) in a child process on "
      "127.0.0.1; clients = asynchronous connections on %d thread%s in this process, each "
      "proving the job token; %u cores, load average %s at start (other work on this machine "
      "shows in the numbers); RLIMIT_NOFILE %ld\n",
      threads, threads == 1 ? "" : "s", std::thread::hardware_concurrency(), load_average().c_str(),
      open_files);
  std::fflush(stdout);

  int failed = 0;
  if (rendezvous) {
    std::vector<RendezvousRow> rows;
    for (int n : sizes) {
      ServerProcess server(o.token);  // fresh per size: no keys or sessions carried over
      o.port = server.port();
      RendezvousRow row;
      row.r = run_rendezvous(o, n);
      row.server = server.finish();
      if (row.r.completed != n) ++failed;
      rows.push_back(row);
    }
    print_rendezvous(rows);
  }
  if (load) {
    ServerProcess server(o.token);
    o.port = server.port();
    std::vector<StoreSample> samples = run_load(o, load_clients, seconds);
    server.finish();
    print_load(samples, seconds);
  }
  std::fflush(stdout);
  return failed ? 1 : 0;
}

}  // namespace weft::launch
