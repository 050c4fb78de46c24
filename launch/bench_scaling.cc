// `weft bench scaling`: every row runs the real trainer under `weft run --standalone` (one
// process and one BLAS thread per rank) and reads the step times of its metrics file; the
// prediction is `weft plan`'s: make_plan + simulate_plan under a CostModel calibrated here.
#include "launch/bench_scaling.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "base/config.h"
#include "base/check.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "comm/registry.h"
#include "comm/store/in_memory_store.h"
#include "core/config/job_spec.h"
#include "core/cpu/kernels.h"
#include "core/io/metrics.h"
#include "core/tensor.h"
#include "launch/args.h"
#include "parallel/launch_env.h"
#include "parallel/trainer.h"
#include "planner/planner.h"
#include "planner/simulate.h"

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

// The lower quartile (nearest rank).
double quartile1(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 4];
}

// A model family: its YAML and the overrides that give its shapes. Calibration is per family
// because the tiny layout models are bound by per-op overhead, config S by GEMMs.
struct Family {
  std::string name, config;
  std::vector<std::string> sets;
};

struct Row {
  std::string name;
  int family = 0;  // index into the families
  int world = 1;
  std::vector<std::string> sets;
  bool fit = false;  // the calibration point of its family: error 0 by construction
  // measured_ms: the lower quartile of the step times, what the model predicts: an
  // undisturbed step. On a shared machine a step is at times slowed as a whole (its compute
  // jumps by half, e.g. 6.5 -> 10.5 ms, on every layout including world 1) by load the model
  // cannot see; median_ms is shown beside it, and tokens/s is the median's.
  double measured_ms = std::nan(""), median_ms = std::nan(""), predicted_ms = std::nan(""),
         tokens_per_s = std::nan("");
  // Rank 0's compute and communication wait (metrics compute_ms / comm_ms; the simulated
  // rank 0's compute_s and comm_s + wait_s): where a step's error sits.
  double compute_ms = std::nan(""), comm_ms = std::nan(""), pred_compute_ms = std::nan(""),
         pred_comm_ms = std::nan("");
  std::string error;
  std::string warning;  // the run exited badly after writing every step: timings kept
};

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<std::string> all_sets(const Family& f, const Row& r, int steps,
                                  const std::string& out) {
  std::vector<std::string> s = f.sets;
  s.insert(s.end(), r.sets.begin(), r.sets.end());
  // Short runs: warmup below the step count (validation wants it), no evaluation, no spam.
  s.insert(s.end(),
           {"train.steps=" + std::to_string(steps), "train.warmup_steps=1", "train.eval_every=0",
            "train.log_every=1000000", "train.threads=1", "train.out_dir=" + out});
  return s;
}

// Runs the row's job on `world` local processes and fills the times and tokens/s from the
// steps after the first (the first pays for first-touch and connections).
void measure(Row& r, const Family& f, int steps) {
  char tmpl[] = "/tmp/weft-scaling-XXXXXX";
  if (!::mkdtemp(tmpl)) throw IoError("weft bench scaling: cannot create a temporary folder");
  const std::string dir = tmpl;
  // WEFT_PLAN_EXECUTOR: world 1 runs the plan executor too, so that the calibration point
  // pays the per-instruction costs the layouts pay.
  std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 WEFT_PLAN_EXECUTOR=1 " + quote(self_exe()) +
                    " run --standalone --nproc-per-node " + std::to_string(r.world) +
                    " -- weft train --config " + quote(f.config);
  for (const std::string& s : all_sets(f, r, steps, dir + "/run")) cmd += " --set " + quote(s);
  cmd += " >" + quote(dir + "/log") + " 2>&1";
  int status = std::system(cmd.c_str());
  const bool ok = status == 0;
  const std::string failed = "the run failed (exit " +
                             std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                             "); log kept in " + dir + "/log";
  try {
    std::vector<double> ms, tps, cms, wms;
    int64_t last = -1;
    if (std::filesystem::exists(dir + "/run/metrics.jsonl"))
      for (const core::io::MetricsRow& m : core::io::read_metrics(dir + "/run/metrics.jsonl")) {
        if (m.is_validation() || !m.has("step_ms")) continue;
        last = std::max(last, int64_t(m.at("step")));
        if (m.at("step") < 1) continue;
        ms.push_back(m.at("step_ms"));
        tps.push_back(m.at("tokens_per_s"));
        if (m.has("compute_ms")) cms.push_back(m.at("compute_ms"));
        if (m.has("comm_ms")) wms.push_back(m.at("comm_ms"));
      }
    // A rank that crashes while shutting down, after every step was written, does not make
    // the timings wrong: keep them and say so (the log stays for whoever fixes the crash).
    if (!ok && last + 1 < steps) throw IoError(failed);
    if (ms.empty()) throw IoError("no step after the first in " + dir + "/run/metrics.jsonl");
    r.measured_ms = quartile1(ms);
    r.median_ms = median(ms);
    r.tokens_per_s = median(tps);
    r.compute_ms = quartile1(cms);
    r.comm_ms = quartile1(wms);
    if (ok)
      std::filesystem::remove_all(dir);
    else
      r.warning = "after its last step, " + failed;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
}

// The predicted step; `split` (optional) receives rank 0's compute and comm + wait, ms.
double predict_ms(const Row& r, const Family& f, const planner::CostModel& cm,
                  std::pair<double, double>* split = nullptr) {
  core::JobSpec spec = core::load_job_spec(f.config, all_sets(f, r, 2, "/tmp/weft-scaling-plan"));
  planner::PlanOptions opt;
  opt.cost = cm;
  opt.simulate = false;
  core::ModelGraph mg = planner::build_planning_graph(spec);
  planner::Plan plan = planner::make_plan(spec, mg.graph, r.world, opt);
  planner::CostAnnotations c = planner::simulate_plan(plan, mg.graph, cm);
  double ms = c.step_s * 1e3;
  if (split && !c.ranks.empty())
    *split = {c.ranks[0].compute_s * 1e3, (c.ranks[0].comm_s + c.ranks[0].wait_s) * 1e3};
  // step_ms also covers what the multi-rank trainer does after the plan's program: the loss
  // and gradient norm gathered from every rank (parallel/trainer.cc all_gather_values: one
  // all_gather of the counts, one of the values).
  if (r.world > 1)
    ms += 2e3 * cm.collective(planner::CollKind::kAllGather, r.world, 64 * r.world, false, r.world);
  return ms;
}

// Compute and local instructions of rank 0's program: what the per-op overhead multiplies.
int64_t count_ops(const Row& r, const Family& f) {
  core::JobSpec spec = core::load_job_spec(f.config, all_sets(f, r, 2, "/tmp/weft-scaling-plan"));
  planner::PlanOptions opt;
  opt.simulate = false;
  core::ModelGraph mg = planner::build_planning_graph(spec);
  planner::Plan plan = planner::make_plan(spec, mg.graph, r.world, opt);
  int64_t n = 0;
  for (const planner::Instr& in : plan.roles.at(0).program)
    n += in.kind == planner::InstrKind::kCompute || in.kind == planner::InstrKind::kLocal;
  return n;
}

// Single-thread SGEMM rate at a model's MLP shape (tokens x 4C x C), FLOP/s.
double gemm_flops(int64_t M, int64_t N, int64_t K) {
  std::vector<float> a(size_t(M * K), 0.5f), b(size_t(K * N), 0.25f), c(size_t(M * N));
  auto once = [&] {
    core::cpu::gemm<float>(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, c.data(), N);
  };
  once();
  int iters = 0;
  auto t0 = Clock::now();
  while (iters < 3 || since(t0) < 0.1) once(), ++iters;
  return 2.0 * double(M * N * K) * iters / since(t0);
}

double memcpy_bw() {
  std::vector<char> a(size_t(32) << 20, 1), b(a.size());
  std::memcpy(b.data(), a.data(), a.size());
  auto t0 = Clock::now();
  for (int i = 0; i < 4; ++i) std::memcpy(b.data(), a.data(), a.size());
  return 2.0 * 4 * double(a.size()) / since(t0);  // read + write
}

// ---- the communication probe: one process per rank under `weft run`, like the trainer ----

// Seconds of one call of `op` on every rank: the mean over iterations of each rank's time
// (a step pays the sum over its calls, and a call's time is bimodal on a busy machine: a
// wake-up that waits for a scheduler tick or not), then the slowest rank's mean. `filler` (may be empty) runs before each call, untimed:
// with it, the call is timed while the other processes of the machine compute, as in a step.
double probe_time(comm::Communicator& world, int iters, const std::function<void()>& filler,
                  const std::function<void()>& op, bool barrier) {
  std::vector<double> v;
  for (int i = 0; i < iters + 3; ++i) {
    if (barrier) world.barrier().wait();
    if (filler) filler();
    auto t0 = Clock::now();
    op();
    if (i >= 3) v.push_back(since(t0));
  }
  double mean = 0;
  for (double x : v) mean += x / double(v.size());
  core::Tensor m = core::Tensor::from_vector<double>({1}, {mean});
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMax;
  world.all_reduce(m, o).wait();
  return m.data<double>()[0];
}

// `weft bench scaling --probe FILE` on every rank of `weft run --standalone`: Gloo's latency
// and bandwidth between processes of this machine at this world size, idle and while every
// process also computes (more processes than cores: a message waits for its peer's time
// slice). Rank 0 writes `name seconds` lines to FILE.
int probe_worker(const std::string& path) {
  parallel::LaunchEnv env = parallel::detect_launch_env();
  parallel::WorkerWorld w(env, comm::Millis(120'000));
  comm::Communicator& c = w.comm();
  core::cpu::set_num_threads(1);
  const int n = c.size(), me = c.rank();
  WEFT_CHECK(n >= 2 && n % 2 == 0, "bench scaling probe: an even world of 2 or more");
  std::unique_ptr<comm::Communicator> pair_owner = n > 2 ? c.split(me / 2, me % 2) : nullptr;
  comm::Communicator& pair = pair_owner ? *pair_owner : c;
  // The filler: the layout models' GEMM (64 x 128 x 32), ten times (~0.1-0.2 ms).
  std::vector<float> a(64 * 32, 0.5f), b(128 * 32, 0.25f), y(64 * 128);
  auto filler = [&] {
    for (int k = 0; k < 10; ++k)
      core::cpu::gemm<float>(false, true, 64, 128, 32, 1.f, a.data(), 32, b.data(), 32, 0.f,
                             y.data(), 128);
  };
  core::Tensor small = core::Tensor::zeros({1}, core::DType::kF32);
  core::Tensor big = core::Tensor::zeros({int64_t(1) << 18}, core::DType::kF32);  // 1 MiB
  auto ar = [](comm::Communicator& g, core::Tensor& t) { return [&g, &t] { g.all_reduce(t).wait(); }; };
  // Ping-pong within the pair: even members send first; one-way time = round trip / 2.
  auto pingpong = [&](core::Tensor& t) {
    return [&pair, &t] {
      int peer = 1 - pair.rank();
      if (pair.rank() == 0) {
        pair.send(t, peer).wait();
        pair.recv(t, peer).wait();
      } else {
        pair.recv(t, peer).wait();
        pair.send(t, peer).wait();
      }
    };
  };
  std::vector<std::pair<std::string, double>> out;
  out.push_back({"ar_world_4B", probe_time(c, 60, nullptr, ar(c, small), true)});
  out.push_back({"ar_world_1MiB", probe_time(c, 8, nullptr, ar(c, big), true)});
  out.push_back({"ar_pair_4B", probe_time(c, 60, nullptr, ar(pair, small), true)});
  out.push_back({"ar_world_4B_busy", probe_time(c, 60, filler, ar(c, small), false)});
  out.push_back({"ar_pair_4B_busy", probe_time(c, 60, filler, ar(pair, small), false)});
  out.push_back({"p2p_4B", probe_time(c, 60, nullptr, pingpong(small), true) / 2});
  out.push_back({"p2p_1MiB", probe_time(c, 8, nullptr, pingpong(big), true) / 2});
  out.push_back({"p2p_4B_busy", probe_time(c, 60, filler, pingpong(small), false) / 2});
  auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) filler();
  out.push_back({"filler", since(t0) / 20});
  c.barrier().wait();
  if (me == 0) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw IoError("bench scaling probe: cannot write " + path);
    for (const auto& [k, v] : out) std::fprintf(f, "%s %.9g\n", k.c_str(), v);
    std::fclose(f);
  }
  return 0;
}

// Runs the probe on `n` processes; empty on failure.
std::map<std::string, double> probe(int n) {
  std::map<std::string, double> out;
  char tmpl[] = "/tmp/weft-probe-XXXXXX";
  if (!::mkdtemp(tmpl)) return out;
  const std::string dir = tmpl;
  std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + quote(self_exe()) +
                    " run --standalone --nproc-per-node " + std::to_string(n) +
                    " -- weft bench scaling --probe " + quote(dir + "/out") + " >" +
                    quote(dir + "/log") + " 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "communication probe on %d processes failed; log in %s/log\n", n,
                 dir.c_str());
    return out;
  }
  if (FILE* f = std::fopen((dir + "/out").c_str(), "r")) {
    char name[64];
    double v;
    while (std::fscanf(f, "%63s %lf", name, &v) == 2) out[name] = v;
    std::fclose(f);
  }
  std::filesystem::remove_all(dir);
  return out;
}

// Median step of `steps` in-process steps of the family at world 1 (after one warm-up), ms:
// through the single-process trainer (what `weft train` runs at world 1) or through the
// multi-rank executor on a one-rank loopback world (what every rank of a layout runs).
double world1_ms(const core::JobSpec& spec, bool multi_rank, int steps) {
  core::cpu::set_num_threads(1);
  core::BatchFn batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    for (int64_t i = 0; i < n * spec.model.seq_len; ++i) {
      x[i] = int32_t((s * 131 + b0 * 17 + i * 7) % 256);
      y[i] = int32_t((s * 131 + b0 * 17 + i * 7 + 1) % 256);
    }
  };
  std::vector<double> ms;
  auto run = [&](auto& trainer) {
    for (int i = 0; i <= steps; ++i) {
      auto t0 = Clock::now();
      trainer.step(batch);
      if (i > 0) ms.push_back(since(t0) * 1e3);
    }
  };
  if (multi_rank) {
    comm::CommOptions o;
    o.rank = 0, o.size = 1;
    auto c = comm::make_communicator(comm::BackendKind::kLoopback, o);
    parallel::ParallelTrainer t(spec, *c);
    run(t);
  } else {
    core::Trainer t(spec);
    run(t);
  }
  return median(ms);
}

constexpr const char* kHelp = R"(usage: weft bench scaling [--quick] [--steps N]
  config S (4x256, seq 256, batch 8, vocab 256) tokens/s at world 1 and dp2 and the scaling
  efficiency; every layout's measured step time (real ranks, one thread each) beside the
  planner's predicted step time under a cost model calibrated on this machine.
  --quick     config S at world 1 and dp2 only, 2 steps
  --steps N   steps per run (default 20; the first is not counted)
)";

}  // namespace

int run_scaling(const std::vector<std::string>& argv) {
  Args a(std::vector<std::string>(argv.begin() + 1, argv.end()), {"--steps", "--probe"},
         {"--quick", "--help", "--probe-only", "--exec-only"});
  if (a.has("--probe")) return probe_worker(a.get("--probe"));
  if (a.flag("--exec-only")) {
    for (const char* f : {"gpt-layout.yaml", "moe-layout.yaml"}) {
      core::JobSpec s = core::load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/" + f,
                                            {"parallel.dp=1", "train.threads=1", "train.warmup_steps=1"});
      for (int k = 0; k < 3; ++k)
        std::printf("%s single %.2f ms, multi-rank executor %.2f ms\n", f, world1_ms(s, false, 8),
                    world1_ms(s, true, 8));
    }
    return 0;
  }
  if (a.flag("--probe-only")) {
    for (int n : {2, 4, 8}) {
      std::printf("n=%d:", n);
      for (const auto& [k, v] : probe(n)) std::printf(" %s %.1fus", k.c_str(), v * 1e6);
      std::printf("\n");
      std::fflush(stdout);
    }
    return 0;
  }
  if (a.flag("--help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const bool quick = a.flag("--quick");
  const int steps = int(a.get_int("--steps", quick ? 2 : 20));
  if (steps < 2) throw ConfigError("--steps", "give at least 2: the first step is not counted");
  const std::string cfg = std::string(WEFT_SOURCE_DIR) + "/configs/";
  const std::vector<Family> fam = {{"S",
                                    cfg + "gpt-layout.yaml",
                                    {"model.layers=4", "model.dim=256", "model.heads=4",
                                     "model.seq_len=256", "train.global_batch=8"}},
                                   {"gpt", cfg + "gpt-layout.yaml", {}},
                                   {"moe", cfg + "moe-layout.yaml", {}}};
  std::vector<Row> rows = {{"S world 1", 0, 1, {"parallel.dp=1", "train.micro_batch=8"}, true},
                           {"S dp2", 0, 2, {"parallel.dp=2", "train.micro_batch=4"}}};
  if (!quick) {
    const std::vector<Row> layouts = {
        {"gpt world 1", 1, 1, {"parallel.dp=1"}, true},
        {"dp2", 1, 2, {"parallel.dp=2"}},
        {"dp4", 1, 4, {"parallel.dp=4"}},
        {"tp2", 1, 2, {"parallel.dp=1", "parallel.tp=2"}},
        {"tp4", 1, 4, {"parallel.dp=1", "parallel.tp=4"}},
        {"pp2 gpipe", 1, 2, {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=gpipe"}},
        {"pp2 1f1b", 1, 2, {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"}},
        {"pp4 interleaved v2",
         1,
         4,
         {"parallel.dp=1", "parallel.pp=4", "parallel.pipeline.schedule=interleaved",
          "parallel.pipeline.virtual_stages=2"}},
        {"dp2xtp2", 1, 4, {"parallel.dp=2", "parallel.tp=2"}},
        {"tp2xpp2", 1, 4, {"parallel.dp=1", "parallel.tp=2", "parallel.pp=2"}},
        {"dp2xpp2 zero1", 1, 4, {"parallel.dp=2", "parallel.pp=2", "parallel.zero=1"}},
        {"dp2 zero2", 1, 2, {"parallel.dp=2", "parallel.zero=2"}},
        {"dp2 zero3", 1, 2, {"parallel.dp=2", "parallel.zero=3"}},
        {"dp2xtp2xpp2", 1, 8, {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2"}},
        {"moe world 1", 2, 1, {"parallel.dp=1"}, true},
        {"ep2 (MoE)", 2, 2, {"parallel.dp=1", "parallel.ep=2"}},
        {"ep4 (MoE)", 2, 4, {"parallel.dp=1", "parallel.ep=4"}},
        {"ep2xdp2 (MoE)", 2, 4, {"parallel.dp=2", "parallel.ep=2"}}};
    rows.insert(rows.end(), layouts.begin(), layouts.end());
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto t_all = Clock::now();

  // ---- calibration: measured once, then one fitted compute rate per family ----
  core::cpu::set_num_threads(1);
  planner::CostModel base;
  base.ranks_per_node = 1 << 20;  // every rank is on this machine: intra-node links only
  base.mem_bw = memcpy_bw();
  base.cores = int(cores);
  // Gloo between processes of this machine, one per rank as in the runs: at 2 processes
  // (no more than the cores here) and at every larger world the rows use, while every
  // process computes between calls as in a step.
  // The machine may be shared: probe before and after the runs and average the two.
  std::map<int, std::map<std::string, double>> pr;
  auto probe_all = [&] {
    std::vector<int> worlds = {2};
    for (const Row& r : rows)
      if (std::find(worlds.begin(), worlds.end(), r.world) == worlds.end() && r.world > 2)
        worlds.push_back(r.world);
    for (int n : worlds)
      for (const auto& [k, v] : probe(n))
        pr[n][k] = pr[n].count(k) ? 0.5 * (pr[n][k] + v) : v;
  };
  probe_all();
  // ---- runs, between the two probes ----
  for (Row& r : rows) {
    auto t0 = Clock::now();
    measure(r, fam[size_t(r.family)], steps);
    std::fprintf(stderr, "%s (world %d): %.1f s%s\n", r.name.c_str(), r.world, since(t0),
                 r.error.empty() ? "" : (" FAILED: " + r.error).c_str());
  }
  probe_all();
  auto got = [&](int n, const char* k) {
    auto it = pr[n].find(k);
    return it == pr[n].end() ? std::nan("") : it->second;
  };
  const double p2p2 = got(2, "p2p_4B"), ar2 = got(2, "ar_pair_4B_busy"), big2 = got(2, "ar_world_1MiB");
  const bool have_ar = std::isfinite(p2p2) && std::isfinite(ar2) && std::isfinite(big2) && ar2 > 0;
  std::printf("== calibration (one thread per rank, %u cores, OPENBLAS_CORETYPE=%s)\n", cores,
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "unset");
  std::printf("memcpy: %.2f GB/s -> mem_bw; cores %d -> cores\n", base.mem_bw / 1e9, base.cores);
  if (have_ar) {
    // One message step = a one-way 4 B send (ping-pong / 2); launch = the rest of a 4 B
    // all-reduce of 2 computing processes beyond its 2 steps; bandwidth from 4 B -> 1 MiB (an
    // all-reduce of 2 moves 1 MiB per rank).
    // A message step is no slower than half the all-reduce that makes two of them.
    base.alpha_intra = std::min(p2p2, 0.5 * ar2);
    base.launch = std::max(0.0, ar2 - 2 * base.alpha_intra);
    // The slope between the idle 4 B and 1 MiB all-reduces of the same group.
    const double small2 = got(2, "ar_world_4B");
    base.bw_intra = double(1 << 20) / std::max(1e-5, big2 - (std::isfinite(small2) ? small2 : 0));
    // More processes than cores: each call also waits for its members' time slices. One
    // estimate per probed oversubscribed world and measurement, the median kept.
    std::vector<double> est;
    for (auto& [n, m] : pr) {
      if (n <= int(cores) || m.empty()) continue;
      double a = got(n, "ar_pair_4B_busy"), w = got(n, "ar_world_4B_busy"), p = got(n, "p2p_4B_busy");
      if (std::isfinite(a)) est.push_back(a - base.launch - 2 * base.alpha_intra);
      if (std::isfinite(w)) est.push_back(w - base.launch - 2.0 * (n - 1) * base.alpha_intra);
      if (std::isfinite(p)) est.push_back(p - base.alpha_intra);
    }
    if (!est.empty()) base.launch_oversub = std::max(0.0, median(est));
    for (auto& [n, m] : pr) {
      std::printf("gloo n=%d:", n);
      for (const auto& [k, v] : m) std::printf(" %s %.0fus", k.c_str(), v * 1e6);
      std::printf("\n");
    }
    std::printf(
        "-> launch %.0f us, alpha_intra %.0f us, bw_intra %.2f GB/s, launch_oversub %.0f us (%s)\n",
        base.launch * 1e6, base.alpha_intra * 1e6, base.bw_intra / 1e9, base.launch_oversub * 1e6,
        "mean of the probes before and after the runs");
  } else {
    std::printf("gloo probe: unavailable; collective terms keep the model's defaults\n");
  }

  std::vector<planner::CostModel> models(fam.size(), base);
  std::vector<bool> used(fam.size(), false);
  for (const Row& r : rows) used[size_t(r.family)] = true;
  for (size_t i = 0; i < fam.size(); ++i) {
    if (!used[i]) continue;
    core::JobSpec s = core::load_job_spec(fam[i].config, fam[i].sets);
    int64_t tokens = s.train.micro_batch * s.model.seq_len;
    models[i].flops = gemm_flops(tokens, 4 * s.model.dim, s.model.dim);
    std::printf("%s: SGEMM %lldx%lldx%lld at %.2f GFLOP/s -> flops\n", fam[i].name.c_str(),
                (long long)tokens, (long long)(4 * s.model.dim), (long long)s.model.dim,
                models[i].flops / 1e9);
  }
  std::fflush(stdout);

  // The world-1 run of a family fixes its per-op overhead: the simulated world-1 step at the
  // measured GEMM and memcpy rates leaves (measured - simulated) / instructions per op
  // (world 1 has no communication). When the rates alone overshoot (a GEMM-bound family
  // running faster than the probe shape), the overhead stays 0 and the rates are scaled.
  for (const Row& r : rows) {
    if (!r.fit || !r.error.empty()) continue;
    planner::CostModel& cm = models[size_t(r.family)];
    const double raw = predict_ms(r, fam[size_t(r.family)], cm);
    const int64_t ops = count_ops(r, fam[size_t(r.family)]);
    if (r.measured_ms >= raw) {
      cm.op_overhead = (r.measured_ms - raw) * 1e-3 / double(std::max<int64_t>(1, ops));
      std::printf("%s: world-1 step %.1f ms measured, %.1f ms at the measured rates, %lld ops -> "
                  "op_overhead %.2f us\n",
                  fam[size_t(r.family)].name.c_str(), r.measured_ms, raw, (long long)ops,
                  cm.op_overhead * 1e6);
    } else {
      double k = raw / r.measured_ms;
      cm.flops *= k;
      cm.mem_bw *= k;
      std::printf("%s: world-1 step %.1f ms measured, %.1f ms at the measured rates -> rates "
                  "scaled x%.3f (effective %.2f GFLOP/s), op_overhead 0\n",
                  fam[size_t(r.family)].name.c_str(), r.measured_ms, raw, k, cm.flops / 1e9);
    }
  }
  for (Row& r : rows) {
    try {
      std::pair<double, double> split;
      r.predicted_ms = predict_ms(r, fam[size_t(r.family)], models[size_t(r.family)], &split);
      r.pred_compute_ms = split.first;
      r.pred_comm_ms = split.second;
    } catch (const std::exception& e) {
      if (r.error.empty()) r.error = std::string("plan: ") + e.what();
    }
  }

  std::printf(
      "\n== layouts (steps 1..%d; measured = the lower quartile of the step times, median beside "
      "it; error against the quartile; S: 4x256 seq 256 batch 8; others: configs/*-layout.yaml)\n",
      steps - 1);
  std::printf("%-20s | %5s | %19s | %12s | %8s | %19s | %19s\n", "layout", "world",
              "step ms q1 / median", "predicted ms", "error", "r0 compute meas/pred",
              "r0 comm meas/pred");
  for (const Row& r : rows) {
    if (!r.error.empty() && !std::isfinite(r.measured_ms)) {
      std::printf("%-20s | %5d | %19s | %12.2f | %8s  (%s)\n", r.name.c_str(), r.world, "failed",
                  r.predicted_ms, "-", r.error.c_str());
      continue;
    }
    double err = (r.predicted_ms - r.measured_ms) / r.measured_ms * 100;
    std::printf("%-20s | %5d | %8.2f / %8.2f | %12.2f | %+7.1f%% | %8.2f / %8.2f | %8.2f / %8.2f%s%s%s\n",
                r.name.c_str(), r.world, r.measured_ms, r.median_ms, r.predicted_ms, err, r.compute_ms,
                r.pred_compute_ms, r.comm_ms, r.pred_comm_ms, r.fit ? "  (calibration point)" : "",
                unsigned(r.world) > cores ? "  (oversubscribed)" : "",
                r.warning.empty() ? "" : ("  (warning: " + r.warning + ")").c_str());
  }
  if (!quick)
    std::printf(
        "note: worlds over this machine's %u cores time-share them (one thread per rank); the "
        "model slows their compute by (ranks computing at once)/cores and adds launch_oversub per call\n",
        cores);
  const Row &s1 = rows[0], &s2 = rows[1];
  std::printf("\n== config S tokens/s\n");
  std::printf(
      "world 1: %.1f tokens/s\ndp2:     %.1f tokens/s\nefficiency tps(dp2) / (2 tps(1)): %.1f%%\n",
      s1.tokens_per_s, s2.tokens_per_s, s2.tokens_per_s / (2 * s1.tokens_per_s) * 100);
  std::printf("total %.1f s\n", since(t_all));
  for (const Row& r : rows)
    if (!r.error.empty()) return 1;
  return 0;
}

}  // namespace weft::launch
