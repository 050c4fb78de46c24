// `weft bench comm` driver: spawns the ranks of each (backend, world size), collects their
// JSON lines, and prints bus bandwidth beside memcpy's, Gloo's algorithm crossover and the
// store's latency. Ranks are spawned (posix_spawn), not forked, since the driver has threads.
#include "launch/bench_comm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "comm/registry.h"
#include "comm/store/tcp_store_server.h"
#include "core/io/json.h"
#include "launch/bench_store.h"

extern char** environ;

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;

// The MPI runtime on this machine only: shared memory between ranks, its control channel on
// loopback; the settings of tests/comm/CMakeLists.txt. They turn single copy (CMA) off since
// it needs ptrace rights that containers often withhold; the "cma" variant measures it.
std::vector<std::string> mpi_env(const std::string& single_copy) {
  return {"OMPI_MCA_btl=self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism=" + single_copy,
          "OMPI_MCA_oob_tcp_if_include=lo"};
}

// Mirrors kBcubeMaxBytes in comm/gloo/gloo_communicator.cc, for the closing note only.
constexpr int64_t kGlooBcubeMaxBytes = int64_t(512) << 10;

std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Bytes copied per second by one thread's memcpy between two buffers of `bytes`, best of 6.
// At 256 MiB the copy streams from memory: the most a shared-memory transport's copy can reach
// for big messages. The 8 MiB figure (in cache) is printed for context.
double memcpy_gbps(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    src[size_t(i)] = dst[bytes - 1 - size_t(i)];  // keep the copies observable
  }
  return double(bytes) / best / 1e9;
}

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout when captured
};

// posix_spawn is fork+exec with nothing in between, so it is safe from a threaded process.
Child spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
            bool capture) {
  int fds[2] = {-1, -1};
  if (capture && ::pipe2(fds, O_CLOEXEC) != 0) throw IoError("bench comm: pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (capture)
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  else
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  std::vector<char*> argv, envp;
  for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  // Ours replace the caller's settings of the same names (the first of a name would win).
  auto overridden = [&](const char* e) {
    for (const auto& x : extra_env)
      if (std::strncmp(e, x.c_str(), x.find('=') + 1) == 0) return true;
    return false;
  };
  for (char** e = environ; *e; ++e)
    if (!overridden(*e)) envp.push_back(*e);
  for (const auto& s : extra_env) envp.push_back(const_cast<char*>(s.c_str()));
  envp.push_back(nullptr);
  Child c;
  int rc = ::posix_spawnp(&c.pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (capture) ::close(fds[1]);
  if (rc != 0) {
    if (capture) ::close(fds[0]);
    throw IoError("bench comm: cannot start " + args[0] + ": " + std::strerror(rc));
  }
  c.out = fds[0];
  return c;
}

// Reads rank 0's JSON lines into `run` until it closes its stdout, then reaps every child;
// kills all of them at `deadline` so a hung run costs minutes, not the benchmark.
void collect(CommRun& run, const std::vector<Child>& children, int fd, Clock::time_point deadline) {
  std::string buf;
  char chunk[4096];
  bool timed_out = false;
  for (;;) {
    int left =
        int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, std::min(left, 1000)) <= 0) continue;
    ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got <= 0) break;
    buf.append(chunk, size_t(got));
    for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
      std::string line = buf.substr(0, nl);
      if (line.empty() || line[0] != '{') continue;
      core::io::JsonValue v = core::io::parse_json(line, run.label());
      CommSample s;
      s.op = v.find("op")->text;
      s.bytes = int64_t(v.find("bytes")->number);
      s.seconds = v.find("seconds")->number;
      s.iters = int(v.find("iters")->number);
      run.samples[{s.op, s.bytes}] = s;
    }
  }
  ::close(fd);
  // Rank 0 is done, but a peer stuck in a failed collective would hold on until its own
  // timeout: the deadline bounds the reaping too.
  for (const Child& c : children) {
    int status = 0;
    while (!timed_out && ::waitpid(c.pid, &status, WNOHANG) == 0) {
      if (Clock::now() >= deadline)
        timed_out = true;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (timed_out) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &status, 0);
    }
    if (run.error.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      run.error = timed_out           ? "killed at the deadline"
                  : WIFEXITED(status) ? "a rank exited with " + std::to_string(WEXITSTATUS(status))
                                      : "a rank died of signal " + std::to_string(WTERMSIG(status));
  }
}

bool have_mpirun() {
  if (!comm::backend_available(comm::BackendKind::kMpi)) return false;
  return std::system("command -v mpirun >/dev/null 2>&1") == 0;
}

CommRun run_backend(const std::string& backend, const std::string& variant, int n,
                    std::string worker_args, double limit_s) {
  CommRun run{backend, variant, n, {}, {}};
  if (variant == "poll") worker_args += " --spin";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(limit_s));
  std::vector<std::string> common;
  for (std::stringstream ss(worker_args); ss.good();) {
    std::string w;
    ss >> w;
    if (!w.empty()) common.push_back(w);
  }
  try {
    if (backend == "mpi") {
      std::vector<std::string> args = {
          "mpirun", "-np",   std::to_string(n), "--oversubscribe", "--allow-run-as-root",
          self,     "bench", "comm-mpi-worker"};
      args.insert(args.end(), common.begin(), common.end());
      Child c = spawn(args, mpi_env(variant == "cma" ? "cma" : "none"), true);
      collect(run, {c}, c.out, deadline);
      return run;
    }
    comm::TCPStoreServerOptions so;
    so.host = "127.0.0.1";
    comm::TCPStoreServer server(so);  // the ranks' rendezvous
    std::vector<Child> children;
    int fd = -1;
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> args = {self, "bench", "comm-worker", "--prefix", "bench"};
      args.insert(args.end(), {"--rank", std::to_string(r), "--world", std::to_string(n), "--port",
                               std::to_string(server.port())});
      args.insert(args.end(), common.begin(), common.end());
      Child c = spawn(args, {}, r == 0);
      if (r == 0) fd = c.out;
      children.push_back(c);
    }
    collect(run, children, fd, deadline);
  } catch (const std::exception& e) {
    run.error = e.what();
  }
  return run;
}

// run_backend with a progress line on stderr, so a slow run shows where the time went.
CommRun timed(const std::string& backend, const std::string& variant, int n,
              const std::string& args, double limit_s) {
  auto t0 = Clock::now();
  CommRun r = run_backend(backend, variant, n, args, limit_s);
  std::fprintf(stderr, "%s: %.1f s%s\n", r.label().c_str(),
               std::chrono::duration<double>(Clock::now() - t0).count(),
               r.error.empty() ? "" : " (failed)");
  return r;
}

int run_driver(const Args& a) {
  const bool quick = a.flag("--quick"), probe = !a.flag("--no-probe");
  std::vector<int64_t> ranks = int_list(a.get_or("--ranks", quick ? "2" : "2,4"));
  std::vector<int64_t> sizes;
  if (a.has("--sizes")) {
    sizes = int_list(a.get("--sizes"));
  } else {
    for (int64_t b = 4 << 10; b <= (quick ? 64 << 10 : int64_t(256) << 20); b *= quick ? 16 : 4)
      sizes.push_back(b);
  }
  // Around Gloo's switch, and MPI's variants where messages span many vader fragments.
  std::vector<int64_t> gloo_probe = int_list(
      a.get_or("--probe-sizes",
               quick ? join(sizes) : "16384,65536,262144,524288,1048576,2097152,4194304,8388608"));
  std::vector<int64_t> mpi_probe = int_list(
      a.get_or("--mpi-probe-sizes", quick ? join(sizes) : "65536,262144,1048576,4194304,16777216"));
  for (int64_t n : ranks)
    if (n < 2) throw ConfigError("--ranks", "world sizes must be at least 2");
  // Every rank contributes whole f32 elements to an all_gather of `bytes`.
  for (int64_t bytes : sizes)
    for (int64_t n : ranks)
      if (bytes <= 0 || bytes % (4 * n) != 0)
        throw ConfigError("--sizes", std::to_string(bytes) + " is not a positive multiple of 4 * " +
                                         std::to_string(n) + " bytes");
  std::vector<std::string> backends;
  for (std::stringstream ss(a.get_or("--backends", "gloo,mpi")); ss.good();) {
    std::string b;
    std::getline(ss, b, ',');
    if (b != "gloo" && b != "mpi") throw ConfigError("--backends", "expected gloo and/or mpi");
    backends.push_back(b);
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const auto t_start = Clock::now();

  std::printf(
      "weft bench comm: ranks are processes on this machine (%u cores); Gloo over TCP on "
      "127.0.0.1, MPI over shared memory (btl self,vader); f32\n",
      cores);
  for (int64_t n : ranks)
    if (n > int64_t(cores))
      std::printf(
          "note: %lld ranks oversubscribe %u cores, so those columns measure time-sharing "
          "of the cores as much as the transport\n",
          (long long)n, cores);
  const double memcpy = memcpy_gbps(size_t(256) << 20);
  std::printf(
      "memcpy: %.2f GB/s (one thread, 256 MiB buffers, best of 6; %.2f GB/s in cache at 8 MiB), "
      "the limit of a shared-memory transport; frac = busbw / memcpy\n",
      memcpy, memcpy_gbps(size_t(8) << 20));
  std::fflush(stdout);

  std::vector<CommRun> runs, mpi_probes;
  const double limit = quick ? 120 : 300;
  for (const std::string& b : backends) {
    if (b == "mpi" && !have_mpirun()) {
      std::printf("mpi: skipped (%s)\n", comm::backend_available(comm::BackendKind::kMpi)
                                             ? "mpirun not found on PATH"
                                             : "this build has no MPI backend");
      continue;
    }
    for (int64_t n : ranks) {
      std::string args = "--sizes " + join(sizes) + (quick ? " --quick" : "");
      if (b == "gloo" && probe) args += " --probe-sizes " + join(gloo_probe);
      runs.push_back(timed(b, "", int(n), args, limit));
      if (b != "mpi" || !probe) continue;
      for (const char* v : {"cma", "poll"}) {
        mpi_probes.push_back(
            timed(b, v, int(n), "--sizes " + join(mpi_probe) + (quick ? " --quick" : ""), limit));
      }
    }
  }
  print_collective_table("all_reduce", runs, sizes, memcpy);
  std::printf("busbw = algbw * 2(n-1)/n, algbw = size / time\n");
  print_collective_table("all_gather", runs, sizes, memcpy);
  std::printf("busbw = algbw * (n-1)/n; size = the gathered buffer, each rank sends size/n\n");
  std::map<int, GlooTally> tally = print_gloo_probe(runs, gloo_probe, kGlooBcubeMaxBytes);
  std::map<std::pair<std::string, int>, MpiGain> mpi_gain =
      print_mpi_probe(runs, mpi_probes, mpi_probe);

  std::vector<int> clients;
  for (int64_t c : int_list(a.get_or("--store-clients", quick ? "8" : "8,64")))
    clients.push_back(int(c));
  if (!a.flag("--no-store")) print_store_table(run_store_bench(clients, quick ? 0.2 : 1.0));

  int failed = 0;
  for (const std::vector<CommRun>* set : {&runs, &mpi_probes})
    for (const CommRun& r : *set)
      if (!r.error.empty())
        std::printf("\n%s failed: %s\n", r.label().c_str(), r.error.c_str()), ++failed;
  std::printf(
      "\nnote: gloo all_reduce runs bcube (log2 n steps) up to %s, the pipelined ring above "
      "(kBcubeMaxBytes in comm/gloo/gloo_communicator.cc, raised from 64 KiB on this probe's "
      "data).",
      size_label(kGlooBcubeMaxBytes).c_str());
  for (auto [n, t] : tally)
    std::printf(" n=%d: bcube won %d of %d probed sizes up to the switch, %d of %d above.", n,
                t.below_bcube_won, t.below, t.above_bcube_won, t.above);
  std::printf(" gloo all_gather has one algorithm (ring).\n");
  bool slices = false;
  for (const CommRun& r : runs)
    for (const auto& [key, sample] : r.samples)
      slices = slices || (r.backend == "gloo" && key.second <= (64 << 10) && sample.seconds > 2e-3);
  if (slices)
    std::printf(
        "note: gloo calls on small messages near 4 ms are scheduler slices: each call hands "
        "off between threads that sleep (caller, Weft's worker, Gloo's loop), and on busy "
        "cores a woken thread waits out another's slice; MPI ranks poll instead of sleeping.\n");
  if (!mpi_probes.empty()) {
    std::printf(
        "note: mpi collectives are libnbc's (MPI_I*; by default binomial below 64 KiB, "
        "then reduce-scatter+all-gather or ring), chosen by size inside Open MPI. Against the "
        "shipped settings (geometric mean over sizes and both ops; 'from' = won at "
        "every probed size from there up):");
    for (auto [key, g] : mpi_gain)
      std::printf(" %s n=%d %.2fx from %s;", key.first.c_str(), key.second, g.geomean,
                  g.from < 0 ? "-" : size_label(g.from).c_str());
    std::printf(
        " cma: OMPI_MCA_btl_vader_single_copy_mechanism=cma where ptrace is allowed "
        "(vader copies once above its 4 KiB eager limit, twice below). poll: the MPI "
        "Work's wait backs off (yield, then 20-200 us sleeps between MPI_Test) and "
        "libnbc progresses only inside MPI calls; spinning costs the peers CPU when "
        "ranks outnumber cores.\n");
  }
  std::printf("total %.0f s\n", std::chrono::duration<double>(Clock::now() - t_start).count());
  return failed ? 1 : 0;
}

}  // namespace

constexpr const char* kHelp =
    "usage: weft bench comm [--quick] [--ranks 2,4] [--backends gloo,mpi] [--sizes B,...]\n"
    "                       [--probe-sizes B,...] [--mpi-probe-sizes B,...] [--no-probe]\n"
    "                       [--store-clients 8,64] [--no-store]\n"
    "\n"
    "All-reduce and all-gather bus bandwidth (nccl-tests' definition) of the Gloo and MPI\n"
    "backends per message size, beside one thread's memcpy bandwidth; Gloo's bcube and ring\n"
    "all-reduce side by side; MPI with single copy (CMA) and with a polling wait; latency and\n"
    "throughput of set/get/add against one store server. Ranks are local processes; MPI runs\n"
    "under mpirun (skipped when absent). --quick: 2 ranks, 4 KiB and 64 KiB, a few seconds.\n";

int cmd_bench_comm(const std::vector<std::string>& argv) {
  for (const std::string& s : argv)
    if (s == "--help" || s == "-h") return std::fputs(kHelp, stdout), 0;
  if (argv[0] != "comm" && argv[0] != "comm-worker" && argv[0] != "comm-mpi-worker")
    throw ConfigError("bench", "unknown benchmark '" + argv[0] + "'; expected: comm");
  Args a(std::vector<std::string>(argv.begin() + 1, argv.end()),
         {"--ranks", "--backends", "--sizes", "--probe-sizes", "--mpi-probe-sizes",
          "--store-clients", "--rank", "--world", "--port", "--prefix", "--timeout-ms"},
         {"--quick", "--no-probe", "--no-store", "--spin"});
  if (argv[0] == "comm-worker") return run_comm_worker(a, false);
  if (argv[0] == "comm-mpi-worker") return run_comm_worker(a, true);
  return run_driver(a);
}

}  // namespace weft::launch
