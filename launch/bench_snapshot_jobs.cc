// The training jobs of `weft bench snapshot` (launch/bench_snapshot_parts.h): config S and
// the ~350M state, sized against this machine's memory, run under `weft run --standalone`.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "base/proc.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_agent_files.h"
#include "checkpoint/snapshot_segment.h"
#include "checkpoint/snapshot_writer.h"
#include "core/graph/moe_balance.h"
#include "launch/bench_elastic_parts.h"
#include "launch/bench_snapshot_parts.h"
#include "launch/bench_util.h"
#include "launch/snapshot_parity.h"
#include "parallel/vps.h"
#include "planner/memory_estimate.h"
#include "planner/planner.h"

namespace weft::launch::snapbench {
namespace {

// A worker's resident memory over the planner's estimate, measured at 353.84M parameters on
// one rank with Adam: 6.5 GB resident for an estimate of 5.7 GB.
constexpr double kWorkerOverEstimate = 1.2;
// Of MemAvailable, what the bench lets a job take (the rest: the bench, the page cache).
constexpr double kMemoryShare = 0.9;

std::string mib_text(double bytes) {
  char b[32];
  if (bytes >= double(int64_t(1) << 30))
    std::snprintf(b, sizeof b, "%.2f GiB", bytes / double(int64_t(1) << 30));
  else
    std::snprintf(b, sizeof b, "%.2f MiB", bytes / double(1 << 20));
  return b;
}

// The snapshot bytes of the largest rank of `spec` over `world` ranks: its VPS state (weights,
// Adam's moments, ...) as rank_snapshots.cc lays it into a slot.
int64_t payload_bytes(const core::JobSpec& spec, int world) {
  const core::ModelGraph mg = planner::build_planning_graph(spec);
  const std::unique_ptr<core::MoeBalance> balance = core::MoeBalance::for_model(spec.model);
  const parallel::StateSpace space = parallel::StateSpace::from_graph(mg.graph, balance.get());
  const planner::Plan plan =
      planner::make_plan(spec, mg.graph, world, planner::training_plan_options());
  int64_t most = 0;
  for (int r = 0; r < world; ++r)
    most = std::max(most, checkpoint::snapshot_payload_bytes(parallel::layout_of(space, plan, r)));
  return most;
}

// The layers that give `spec`'s model about `want` parameters: the count is affine in the
// layers at a fixed width and vocabulary.
int layers_for(const core::JobSpec& spec, double want) {
  core::JobSpec one = spec, two = spec;
  one.model.layers = 1;
  two.model.layers = 2;
  const double per_layer = bench::param_count(two) - bench::param_count(one);
  const double rest = bench::param_count(one) - per_layer;
  return int(std::clamp(std::lround((want - rest) / per_layer), 1L, 4096L));
}

// What the job takes on this node: each rank's worker and its two slots (a restart also
// holds a read copy of the snapshot while it restores).
double job_bytes(const JobShape& j, bool recovery) {
  const double worker = kWorkerOverEstimate * planner::estimate_memory(j.spec, j.ranks).total();
  return j.ranks * (worker + double(j.payload) * (recovery ? 3 : 2));
}

// The bench's settings of every job, after the shape's: ZeRO-1 (each rank's moments exist
// once), the shape's threads, a line per step, no evaluation, warm-up below any step count.
std::vector<std::string> bench_sets(const JobShape& j) {
  return {"parallel.zero=1", "train.threads=" + std::to_string(j.threads), "train.warmup_steps=1",
          "train.eval_every=0", "train.log_every=1"};
}

// As the workers load the job, a run's own settings aside.
std::vector<std::string> shape_sets(const JobShape& j, const Options& o) {
  std::vector<std::string> s = j.sets, b = bench_sets(j);
  s.insert(s.end(), b.begin(), b.end());
  s.insert(s.end(), j.layout_sets.begin(), j.layout_sets.end());
  s.insert(s.end(), o.sets.begin(), o.sets.end());
  return s;
}

}  // namespace

std::string JobShape::describe() const {
  const core::ModelSpec& m = spec.model;
  const core::TrainSpec& t = spec.train;
  return str(name == "S" ? "config S" : name + " state", ": ", m.arch, " ", m.layers, " x ", m.dim,
             ", seq ", m.seq_len, ", vocab ", m.vocab, ", global batch ", t.global_batch, ": ",
             str(std::round(params / 1e4) / 100), "M parameters, Adam; ", ranks,
             ranks == 1 ? " rank" : " ranks", " (dp ", ranks, ", zero ", spec.parallel.zero,
             "), train.threads ", threads, "; a snapshot of ", mib_text(double(payload)),
             " per rank");
}

JobShape make_shape(const std::string& name, const Options& o, bool recovery) {
  const std::string cfg = std::string(WEFT_SOURCE_DIR) + "/configs/";
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  JobShape j;
  j.name = name;
  std::vector<int> tries;
  if (name == "S") {
    // `weft bench train`'s and `weft bench scaling`'s config S: 4 x 256, seq 256, batch 8.
    j.config = cfg + "gpt-layout.yaml";
    tries = {o.ranks > 0 ? o.ranks : 2};
    if (8 % tries[0] != 0)
      throw ConfigError("--ranks", str(tries[0],
                                       ": config S's global batch of 8 must divide "
                                       "over the ranks: use 1, 2, 4 or 8"));
  } else {
    // `weft bench elastic`'s job (24 x 1024, vocab 50304, global batch 6), its layers scaled.
    j.config = cfg + "bench-elastic-350m.yaml";
    tries = o.ranks > 0 ? std::vector<int>{o.ranks} : std::vector<int>{2, 1};
    for (int r : tries)
      if (6 % r != 0)
        throw ConfigError("--ranks", str(r, ": the ", name,
                                         " job's global batch of 6 must "
                                         "divide over the ranks: use 1, 2, 3 or 6"));
  }
  const int64_t avail = planner::available_memory_bytes();
  std::string refusal;
  for (int ranks : tries) {
    j.ranks = ranks;
    j.threads = std::max(1, cores / ranks);
    j.sets.clear();
    if (name == "S")
      j.sets = {"model.layers=4",       "model.dim=256",
                "model.heads=4",        "model.seq_len=256",
                "train.global_batch=8", "train.micro_batch=" + std::to_string(8 / ranks)};
    j.spec = core::load_job_spec(j.config, shape_sets(j, o));
    if (name != "S" && std::none_of(o.sets.begin(), o.sets.end(), [](const std::string& s) {
          return s.rfind("model.layers=", 0) == 0;
        })) {
      j.sets.insert(j.sets.begin(),
                    "model.layers=" + std::to_string(layers_for(j.spec, bench::parse_count(name))));
      j.spec = core::load_job_spec(j.config, shape_sets(j, o));
    }
    j.params = bench::param_count(j.spec);
    j.payload = payload_bytes(j.spec, ranks);
    const double need = job_bytes(j, recovery);
    if (avail <= 0 || need <= kMemoryShare * double(avail)) return j;
    refusal = str(j.describe(), ": needs about ", bench::gb(need), " (", ranks, " x (the worker, ",
                  kWorkerOverEstimate, " x the planner's estimate, and ",
                  recovery ? "three" : "two", " snapshots: two slots",
                  recovery ? " and the copy a restart reads" : "", ")), more than ",
                  int(kMemoryShare * 100), "% of the ", bench::gb(double(avail)), " available");
  }
  throw ConfigError(name == "S" || o.ranks > 0 ? "--ranks" : "--configs",
                    refusal + (name == "S" ? ": use fewer --ranks" : ": name a smaller count"));
}

JobShape make_node_shape(const std::string& name, const Options& o, std::string* note) {
  // Per node, beside its worker: three own slots (replicated snapshots keep three), a peer's
  // rank in three (a replica), parity (half a rank in three slots under EC(2,1)), and the
  // copy a restore reads. After the loss, on this one machine, more is held at once: the lost
  // node's slots stay in /dev/shm (a real lost node takes them with it), and each survivor
  // reserves the new epoch's three slots of a dp2 rank (1.5 of a dp3 rank each) while the
  // old ones still hold the state it resumes from, and its worker grows to a dp2 rank's
  // state. Counted per node: 12 snapshots of a dp3 rank and 1.5 workers. (Stop 23: at 8
  // and one worker, 191M passed the check and the kernel's OOM killer took rank 0 during
  // the resize.) Under ec each node also holds, from its reserve on, the segment it would
  // rebuild its group's previous node into, made ahead, and the decode's pieces
  // (SnapshotParity::ahead_bytes: EC(2,1) over the three nodes, one rank each).
  constexpr double kSnapshotsPerNode = 12;
  constexpr double kWorkersPerNode = 1.5;
  constexpr int kNodes = 3;
  JobShape j;
  j.name = name;
  j.ranks = kNodes;
  j.threads = std::max(1, int(std::max(1u, std::thread::hardware_concurrency())) / kNodes);
  j.layout_sets = {"parallel.zero=3", "parallel.dp=auto"};
  // ZeRO shards every tensor, unevenly where its holders divide none of its dims
  // (planner/lower_step.cc, zero_shard), so every shard of dp 3 and of dp 2 exists once
  // whatever the widths; these divide by 3 and 2 anyway, which keeps the shards equal.
  if (name == "S") {
    j.config = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";
    // Config S's depth and sequence at width 384 (vocab 384: the bytes and unused ids); a
    // global batch of 12 (8 does not divide over 3 ranks).
    j.sets = {"model.layers=4",    "model.dim=384",         "model.heads=6",
              "model.vocab=384",   "model.seq_len=256",     "train.global_batch=12",
              "train.micro_batch=2"};
  } else {
    // The ~350M job (vocab 50304 = 3 x 16768, global batch 6) at width 1536, its layers scaled.
    j.config = std::string(WEFT_SOURCE_DIR) + "/configs/bench-elastic-350m.yaml";
    j.sets = {"model.dim=1536", "model.heads=16", "train.micro_batch=1"};
  }
  const std::vector<std::string> base = j.sets;
  j.spec = core::load_job_spec(j.config, shape_sets(j, o));
  const bool scaled = name != "S" && std::none_of(o.sets.begin(), o.sets.end(), [](const auto& s) {
                        return s.rfind("model.layers=", 0) == 0;
                      });
  int layers = scaled ? layers_for(j.spec, bench::parse_count(name)) : int(j.spec.model.layers);
  const int asked = layers;
  const int64_t avail = planner::available_memory_bytes();
  for (;;) {
    if (scaled) {
      JobShape t = j;
      t.sets = base;
      t.sets.insert(t.sets.begin(), "model.layers=" + std::to_string(layers));
      t.spec = core::load_job_spec(t.config, shape_sets(t, o));
      t.params = bench::param_count(t.spec);
      t.payload = payload_bytes(t.spec, kNodes);
      std::swap(j, t);
    } else {
      j.params = bench::param_count(j.spec);
      j.payload = payload_bytes(j.spec, kNodes);
    }
    const double worker = kWorkerOverEstimate * planner::estimate_memory(j.spec, kNodes).total();
    const double ahead = SnapshotParity::ahead_bytes(1, j.payload, kNodes, kNodes - 1);
    const double need =
        kNodes * (kWorkersPerNode * worker + kSnapshotsPerNode * double(j.payload) + ahead);
    if (avail <= 0 || need <= kMemoryShare * double(avail)) break;
    if (!scaled || layers == 1)
      throw ConfigError("--configs", str(j.describe(), ": three nodes need about ", bench::gb(need),
                                         " (", kNodes, " x (", kWorkersPerNode, " workers, ", kSnapshotsPerNode,
                                         " snapshots of a rank and ec's rebuild target made "
                                         "ahead)), more than ",
                                         int(kMemoryShare * 100), "% of the ",
                                         bench::gb(double(avail)), " available"));
    layers = std::max(1, layers * 4 / 5);
  }
  if (note && layers != asked)
    *note = str(name, " asked for, ", str(std::round(j.params / 1e6)), "M fit: three nodes of ",
                "ZeRO-3 with their snapshots, replicas and parity in ", bench::gb(double(avail)));
  return j;
}

// ---- JobRun ----

JobRun::JobRun(const Options& o, const JobShape& shape, const std::string& label,
               const std::vector<std::string>& sets, int max_restarts)
    : o_(o), label_(label), timeout_(o.timeout), origin_(Clock::now()) {
  static std::atomic<int> count{0};
  std::string dirname;
  for (char c : label) dirname += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  folder_ = o.dir / (std::to_string(++count) + "-" + dirname);
  fs::remove_all(folder_);
  fs::create_directories(folder_);
  rdzv_id_ = str("bench-snapshot-", ::getpid(), "-", count.load());
  const std::string self = bench::self_exe();
  std::vector<std::string> argv = {
      self,        "run",   "--standalone", "--nproc-per-node", std::to_string(shape.ranks),
      "--rdzv-id", rdzv_id_};
  if (max_restarts > 0) argv.insert(argv.end(), {"--max-restarts", std::to_string(max_restarts)});
  argv.insert(argv.end(), {"--", self, "train", "--config", shape.config});
  for (const std::string& s : job_sets(o, shape, folder_ / "run", sets))
    argv.insert(argv.end(), {"--set", s});
  // The same threads for every run of a shape; OPENBLAS_* as this process has them.
  ::setenv("OMP_NUM_THREADS", std::to_string(shape.threads).c_str(), 1);
  // One rank trains on the plan executor with or without snapshots (weft train picks the
  // single-process trainer for a lone rank without them): the same code on both sides.
  ::setenv("WEFT_PLAN_EXECUTOR", "1", 1);
  agent_ = std::make_unique<BenchAgent>(argv, (folder_ / "weft-run.log").string(), origin_);
}

std::vector<std::string> job_sets(const Options& o, const JobShape& shape, const fs::path& out_dir,
                                  const std::vector<std::string>& sets) {
  std::vector<std::string> all = shape.sets, b = bench_sets(shape);
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), shape.layout_sets.begin(), shape.layout_sets.end());
  all.push_back("train.out_dir=" + out_dir.string());
  all.insert(all.end(), sets.begin(), sets.end());
  all.insert(all.end(), o.sets.begin(), o.sets.end());
  return all;
}

void remove_job_segments(const std::string& rdzv_id, bool ended) {
  const std::string job = checkpoint::job_id_for_run(rdzv_id);
  for (const std::string& n : checkpoint::snapshot_segments(job))
    checkpoint::SnapshotSegment::unlink(n);
  // The sockets and locks of its agents, killed ones included (a lost node's).
  const std::string prefix = "weft-agent-" + job + "-n";
  for (int tries = ended ? 1 : 50; tries > 0; --tries) {  // an agent may still be exiting
    checkpoint::remove_stale_agent_files(job);
    bool held = false;  // a lock left is a live agent's
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/dev/shm", ec))
      held = held || e.path().filename().string().starts_with(prefix);
    if (!held) break;
    ::usleep(100'000);
  }
}

JobRun::~JobRun() {
  const bool ended = !agent_->running();
  agent_.reset();  // SIGKILL and reap weft run if it still runs: its workers die with it
  // Its snapshot agent (SIGTERMed with weft run) keeps the job's segments for a restart that
  // never comes, and its lock file; they are this bench's.
  remove_job_segments(rdzv_id_, ended);
}

void drop_cache(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double cached_share(const fs::path& dir) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  double in = 0, all = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.file_size() == 0) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    const size_t len = size_t(e.file_size());
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) continue;
    std::vector<unsigned char> v((len + page - 1) / page);
    if (::mincore(p, len, v.data()) == 0)
      for (unsigned char c : v) in += c & 1;
    all += double(v.size());
    ::munmap(p, len);
  }
  return all > 0 ? in / all : -1;
}

double JobRun::now() const { return std::chrono::duration<double>(Clock::now() - origin_).count(); }

void JobRun::pump(int ms) {
  std::vector<std::unique_ptr<BenchAgent>> one;
  one.push_back(std::move(agent_));
  pump_agents(one, ms);
  agent_ = std::move(one[0]);
}

bool JobRun::watch(const std::function<void(const StampedLine&)>& on_line,
                   const std::function<bool()>& done) {
  const double t0 = now();
  for (;;) {
    pump(20);
    const auto& v = agent_->lines();
    while (seen_ < v.size()) on_line(v[seen_++]);
    if (done()) return true;
    if (!agent_->running()) return false;
    if (now() - t0 > timeout_) return false;
  }
}

std::vector<std::pair<int, pid_t>> JobRun::workers() const {
  std::vector<std::pair<int, pid_t>> out;
  for (pid_t c : child_pids(agent_->pid()))
    if (const int rank = weft_rank_of(c); rank >= 0) out.emplace_back(rank, c);
  std::sort(out.begin(), out.end());
  return out;
}

double JobRun::workers_cpu_s() const {
  static const double tick = double(::sysconf(_SC_CLK_TCK));
  double s = 0;
  for (const auto& [rank, pid] : workers()) {
    // The process's CPU clock: every thread's time, the copy threads that ended included,
    // in nanoseconds; /proc's clock ticks (10 ms) where it cannot be read.
    clockid_t clock;
    timespec ts{};
    if (::clock_getcpuclockid(pid, &clock) == 0 && ::clock_gettime(clock, &ts) == 0) {
      s += double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
      continue;
    }
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 1));
    std::string field;
    // Fields 3 to 13 (state ... cmajflt), then utime and stime (proc(5)).
    for (int i = 3; i <= 13 && rest >> field; ++i) {
    }
    double utime = 0, stime = 0;
    if (rest >> utime >> stime) s += (utime + stime) / tick;
  }
  return s;
}

std::string JobRun::tail(size_t n) const {
  const auto& v = agent_->lines();
  std::string s = str("last lines of ", (folder_ / "weft-run.log").string(), ":\n");
  for (size_t k = v.size() > n ? v.size() - n : 0; k < v.size(); ++k) s += "  " + v[k].text + "\n";
  return s;
}

long long step_line(const std::string& s) {
  long long step = -1;
  if (s.rfind("[rank 0] step ", 0) == 0 && s.find("| loss") != std::string::npos)
    std::sscanf(s.c_str() + 14, "%lld", &step);
  return step;
}

}  // namespace weft::launch::snapbench
