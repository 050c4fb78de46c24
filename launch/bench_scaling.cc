// `weft bench scaling`: every row runs the real trainer under `weft run --standalone` (one
// process and one BLAS thread per rank) and reads the median step_ms of its metrics file; the
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
#include <map>
#include <thread>

#include "base/config.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "comm/registry.h"
#include "comm/store/in_memory_store.h"
#include "core/config/job_spec.h"
#include "core/cpu/kernels.h"
#include "core/io/metrics.h"
#include "core/tensor.h"
#include "launch/args.h"
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
  double measured_ms = std::nan(""), predicted_ms = std::nan(""), tokens_per_s = std::nan("");
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

// Runs the row's job on `world` local processes and fills measured_ms and tokens_per_s from
// the median over steps after the first (the first pays for first-touch and connections).
void measure(Row& r, const Family& f, int steps) {
  char tmpl[] = "/tmp/weft-scaling-XXXXXX";
  if (!::mkdtemp(tmpl)) throw IoError("weft bench scaling: cannot create a temporary folder");
  const std::string dir = tmpl;
  std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + quote(self_exe()) +
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
    std::vector<double> ms, tps;
    int64_t last = -1;
    if (std::filesystem::exists(dir + "/run/metrics.jsonl"))
      for (const core::io::MetricsRow& m : core::io::read_metrics(dir + "/run/metrics.jsonl")) {
        if (m.is_validation() || !m.has("step_ms")) continue;
        last = std::max(last, int64_t(m.at("step")));
        if (m.at("step") < 1) continue;
        ms.push_back(m.at("step_ms"));
        tps.push_back(m.at("tokens_per_s"));
      }
    // A rank that crashes while shutting down, after every step was written, does not make
    // the timings wrong: keep them and say so (the log stays for whoever fixes the crash).
    if (!ok && last + 1 < steps) throw IoError(failed);
    if (ms.empty()) throw IoError("no step after the first in " + dir + "/run/metrics.jsonl");
    r.measured_ms = median(ms);
    r.tokens_per_s = median(tps);
    if (ok)
      std::filesystem::remove_all(dir);
    else
      r.warning = "after its last step, " + failed;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
}

double predict_ms(const Row& r, const Family& f, const planner::CostModel& cm) {
  core::JobSpec spec = core::load_job_spec(f.config, all_sets(f, r, 2, "/tmp/weft-scaling-plan"));
  planner::PlanOptions opt;
  opt.cost = cm;
  opt.simulate = false;
  core::ModelGraph mg = planner::build_planning_graph(spec);
  planner::Plan plan = planner::make_plan(spec, mg.graph, r.world, opt);
  return planner::simulate_plan(plan, mg.graph, cm).step_s * 1e3;
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

// Gloo all-reduce of each size over n ranks (threads of this process over loopback TCP): the
// median over calls of the slowest rank's seconds; NaN when Gloo is not built in or fails.
std::vector<double> gloo_allreduce(int n, const std::vector<int64_t>& sizes) {
  std::vector<double> out(sizes.size(), std::nan(""));
#if WEFT_HAVE_GLOO
  comm::InMemoryStore store;
  std::vector<std::vector<double>> times(static_cast<size_t>(n));
  std::string failure;
  auto rank = [&](int r) {
    try {
      comm::CommOptions o;
      o.rank = r, o.size = n, o.store = &store, o.prefix = "scaling" + std::to_string(n);
      auto c = comm::make_communicator(comm::BackendKind::kGloo, o);
      for (int64_t bytes : sizes) {
        core::Tensor t = core::Tensor::zeros({std::max<int64_t>(1, bytes / 4)}, core::DType::kF32);
        int iters = bytes >= (int64_t(1) << 20) ? 6 : 30;
        std::vector<double> v;
        for (int i = 0; i < iters + 2; ++i) {
          c->barrier().wait();
          auto t0 = Clock::now();
          c->all_reduce(t).wait();
          if (i >= 2) v.push_back(since(t0));
        }
        times[size_t(r)].push_back(median(v));
      }
      c->barrier().wait();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  };
  std::vector<std::thread> peers;
  for (int r = 1; r < n; ++r) peers.emplace_back(rank, r);
  rank(0);
  for (std::thread& t : peers) t.join();
  if (!failure.empty()) {
    std::fprintf(stderr, "gloo all_reduce n=%d failed: %s\n", n, failure.c_str());
    return out;
  }
  for (const std::vector<double>& t : times)
    if (t.size() != sizes.size()) return out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out[i] = 0;
    for (const std::vector<double>& t : times) out[i] = std::max(out[i], t[i]);
  }
#endif
  return out;
}

constexpr const char* kHelp = R"(usage: weft bench scaling [--quick] [--steps N]
  config S (4x256, seq 256, batch 8, vocab 256) tokens/s at world 1 and dp2 and the scaling
  efficiency; every layout's measured step time (real ranks, one thread each) beside the
  planner's predicted step time under a cost model calibrated on this machine.
  --quick     config S at world 1 and dp2 only, 2 steps
  --steps N   steps per run (default 6; the first is not counted)
)";

}  // namespace

int run_scaling(const std::vector<std::string>& argv) {
  Args a(std::vector<std::string>(argv.begin() + 1, argv.end()), {"--steps"},
         {"--quick", "--help"});
  if (a.flag("--help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const bool quick = a.flag("--quick");
  const int steps = int(a.get_int("--steps", quick ? 2 : 6));
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
  const std::vector<int64_t> sizes = {4, int64_t(4) << 20};
  std::vector<double> ar = gloo_allreduce(2, sizes);
  const double ar4 = gloo_allreduce(4, {sizes[0]})[0];
  const bool have_ar =
      std::isfinite(ar[0]) && std::isfinite(ar[1]) && ar[1] > ar[0] && std::isfinite(ar4);
  if (have_ar) {
    // all_reduce = launch + 2(n-1) alpha + 2(n-1)/n bytes / bw: the small message at n=2 and
    // n=4 fixes launch and alpha (Gloo's small all-reduce is bcube, log2 n steps, and its
    // latency is mostly thread hand-offs, so alpha comes out small), the slope over 4 MiB
    // at n=2 the bandwidth.
    base.alpha_intra = std::max(0.0, (ar4 - ar[0]) / 4);
    base.launch = std::max(0.0, ar[0] - 2 * base.alpha_intra);
    base.bw_intra = double(sizes[1] - sizes[0]) / (ar[1] - ar[0]);
  }
  std::printf("== calibration (one thread per rank, %u cores)\n", cores);
  std::printf("memcpy: %.2f GB/s -> mem_bw\n", base.mem_bw / 1e9);
  if (have_ar)
    std::printf(
        "gloo all_reduce: n=2 4 B %.0f us, 4 MiB %.2f ms; n=4 4 B %.0f us -> launch %.0f us, "
        "alpha_intra "
        "%.0f us, bw_intra %.2f GB/s\n",
        ar[0] * 1e6, ar[1] * 1e3, ar4 * 1e6, base.launch * 1e6, base.alpha_intra * 1e6,
        base.bw_intra / 1e9);
  else
    std::printf("gloo all_reduce: unavailable; collective terms keep the model's defaults\n");

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

  // ---- runs ----
  for (Row& r : rows) {
    auto t0 = Clock::now();
    measure(r, fam[size_t(r.family)], steps);
    std::fprintf(stderr, "%s (world %d): %.1f s%s\n", r.name.c_str(), r.world, since(t0),
                 r.error.empty() ? "" : (" FAILED: " + r.error).c_str());
  }
  // The world-1 run of a family fixes its compute scale: the model has no per-op overhead
  // term, so FLOP/s and memory bandwidth are scaled together until the simulated world-1
  // step equals the measured one (world 1 has no communication, so the fit is exact).
  for (const Row& r : rows) {
    if (!r.fit || !r.error.empty()) continue;
    planner::CostModel& cm = models[size_t(r.family)];
    double raw = predict_ms(r, fam[size_t(r.family)], cm);
    double k = raw / r.measured_ms;
    std::printf(
        "%s: world-1 step %.1f ms measured, %.1f ms at the SGEMM rate -> compute scaled x%.3f "
        "(effective %.2f GFLOP/s)\n",
        fam[size_t(r.family)].name.c_str(), r.measured_ms, raw, k, cm.flops * k / 1e9);
    cm.flops *= k;
    cm.mem_bw *= k;
  }
  for (Row& r : rows) {
    try {
      r.predicted_ms = predict_ms(r, fam[size_t(r.family)], models[size_t(r.family)]);
    } catch (const std::exception& e) {
      if (r.error.empty()) r.error = std::string("plan: ") + e.what();
    }
  }

  std::printf(
      "\n== layouts (median step over steps 1..%d; S: 4x256 seq 256 batch 8; others: "
      "configs/*-layout.yaml)\n",
      steps - 1);
  std::printf("%-20s | %5s | %11s | %12s | %8s\n", "layout", "world", "measured ms", "predicted ms",
              "error");
  for (const Row& r : rows) {
    if (!r.error.empty() && !std::isfinite(r.measured_ms)) {
      std::printf("%-20s | %5d | %11s | %12.2f | %8s  (%s)\n", r.name.c_str(), r.world, "failed",
                  r.predicted_ms, "-", r.error.c_str());
      continue;
    }
    double err = (r.predicted_ms - r.measured_ms) / r.measured_ms * 100;
    std::printf("%-20s | %5d | %11.2f | %12.2f | %+7.1f%%%s%s%s\n", r.name.c_str(), r.world,
                r.measured_ms, r.predicted_ms, err, r.fit ? "  (calibration point)" : "",
                unsigned(r.world) > cores ? "  (oversubscribed)" : "",
                r.warning.empty() ? "" : ("  (warning: " + r.warning + ")").c_str());
  }
  if (!quick)
    std::printf(
        "note: worlds of 4 and 8 oversubscribe this machine's %u cores (one thread per rank), so "
        "their "
        "measured times include time-sharing the model does not see\n",
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
