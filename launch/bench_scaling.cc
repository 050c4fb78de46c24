// `weft bench scaling`: every row runs the real trainer under `weft run --standalone` (one
// process and one BLAS thread per rank) and reads the step times of its metrics file; the
// prediction is simulate_plan of the row's program (the plan its trainer runs) under this
// machine's calibration (launch/calibration.h, cached by `weft calibrate`).
#include "launch/bench_scaling.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "base/config.h"
#include "base/error.h"
#include "core/config/job_spec.h"
#include "launch/args.h"
#include "launch/bench_attribute.h"
#include "launch/bench_util.h"
#include "launch/calibration.h"
#include "launch/job_cost_model.h"
#include "planner/hardware.h"
#include "planner/planner.h"
#include "planner/simulate.h"

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
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
  // The model whose world-1 steps weft calibrate fits op_overhead to (in process): its
  // error here is not independent of the calibration.
  bool fitted = false;
  // measured_ms: the mean of the step times, the statistic the model predicts. Its waits
  // are means (sync_wait_by_burst and sync_wait_oversub_by_burst: the mean per call of the
  // calibration's loops, every slow call included), and a step is a sum of calls, so what
  // it predicts is the mean step, not an undisturbed one (the lower quartile, which this
  // bench compared against before, leaves the slow calls' share out of the measurement
  // while the model keeps it in). The lower quartile and the median are shown beside it;
  // tokens/s is the median's.
  double measured_ms = std::nan(""), q1_ms = std::nan(""), median_ms = std::nan(""),
         predicted_ms = std::nan(""), tokens_per_s = std::nan("");
  // Rank 0's compute and communication wait (the means of metrics compute_ms / comm_ms; the
  // simulated rank 0's compute_s and comm_s + wait_s): where a step's error sits.
  double compute_ms = std::nan(""), comm_ms = std::nan(""), pred_compute_ms = std::nan(""),
         pred_comm_ms = std::nan("");
  // The prediction without CostModel::sync_wait_by_burst (the model before it), beside.
  double nowait_ms = std::nan("");
  // The prediction without CostModel::sync_wait_oversub_by_burst (launch_oversub per call
  // where ranks outnumber the cores, the model before it), beside.
  double flat_oversub_ms = std::nan("");
  // The prediction without CostModel::sync_wait_oversub_more_by_burst (the 4-process curve
  // for every count above 4, the model before it), beside.
  double one_curve_ms = std::nan("");
  // The prediction without CostModel::replica_drift (wait_spread 0: replicas that never
  // drift apart, the model before it), beside.
  double nodrift_ms = std::nan("");
  std::string error;
  std::string warning;  // the run exited badly after writing every step: timings kept
};

std::vector<std::string> all_sets(const Family& f, const Row& r, int steps,
                                  const std::string& out) {
  std::vector<std::string> s = f.sets;
  s.insert(s.end(), r.sets.begin(), r.sets.end());
  for (const std::string& x : short_run_sets(steps, out)) s.push_back(x);
  return s;
}

// Runs the row's job on `world` local processes (bench_util.h run_layout) and fills the
// times and tokens/s from the steps after the first.
void measure(Row& r, const Family& f, int steps) {
  std::vector<std::string> sets = f.sets;
  sets.insert(sets.end(), r.sets.begin(), r.sets.end());
  const LayoutTimes t = run_layout(f.config, sets, r.world, steps, "scaling");
  r.measured_ms = t.mean_ms;
  r.q1_ms = t.q1_ms;
  r.median_ms = t.median_ms;
  r.tokens_per_s = t.tokens_per_s;
  r.compute_ms = t.compute_mean_ms;
  r.comm_ms = t.comm_mean_ms;
  r.error = t.error;
  r.warning = t.warning;
}

// The predicted step; `split` (optional) receives rank 0's compute and comm + wait, ms.
double predict_ms(const Row& r, const Family& f, const planner::CostModel& cm,
                  std::pair<double, double>* split = nullptr) {
  core::JobSpec spec = core::load_job_spec(f.config, all_sets(f, r, 2, "/tmp/weft-scaling-plan"));
  // The program the row runs (planned under the job's cost model, as its workers plan:
  // job_cost_model.h), priced under `cm`. Planned under `cm`, nearly every multi-rank row was
  // another program (tp4: 2301 instructions against the 1477 that ran).
  core::ModelGraph mg = planner::build_planning_graph(spec);
  planner::Plan plan =
      planner::make_plan(spec, mg.graph, r.world, job_plan_options(spec.train.dtype));
  planner::CostAnnotations c = planner::simulate_plan(plan, mg.graph, cm);
  double ms = c.step_s * 1e3;
  if (split && !c.ranks.empty())
    *split = {c.ranks[0].compute_s * 1e3, (c.ranks[0].comm_s + c.ranks[0].wait_s) * 1e3};
  // simulate_plan counts the trainer's statistics exchange (planner/step_end.h), which
  // step_ms covers too.
  return ms;
}

constexpr const char* kHelp = R"(usage: weft bench scaling [--quick] [--steps N]
  config S (4x256, seq 256, batch 8, vocab 256) tokens/s at world 1 and dp2 and the scaling
  efficiency; every layout's measured step time (real ranks, one thread each) beside the
  planner's predicted step time under a cost model calibrated on this machine.
  The cost model is this machine's calibration (`weft calibrate`), measured first when there
  is none: one model for every row, nothing fitted to these runs.
  --quick        config S at world 1 and dp2 only, 2 steps
  --steps N      steps per run (default 20; the first is not counted)
  --recalibrate  measure the machine again (and rewrite its cache) before the runs
  --probe-only   print the Gloo probe at 2, 4 and 8 processes and stop
  --exec-only    print world-1 steps of the layout models, single-process vs executor
  --attribute ROW  run one row (its name, e.g. "dp2 zero2") under the executor's
                 per-instruction timing and print its rank's time by instruction group beside
                 the model's price of each (--rank R, default 0)
  --compare F1,F2,...  also predict the same runs under these hardware files (other
                 calibrations): each one's median |error| and per-row errors
)";

}  // namespace

int run_scaling(const std::vector<std::string>& argv) {
  Args a(std::vector<std::string>(argv.begin() + 1, argv.end()),
         {"--steps", "--attribute", "--rank", "--compare"},
         {"--quick", "--help", "--probe-only", "--exec-only", "--recalibrate"});
  if (a.flag("--exec-only")) {
    for (const char* f : {"gpt-layout.yaml", "moe-layout.yaml"}) {
      core::JobSpec s = core::load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/" + f,
                                            {"parallel.dp=1", "train.threads=1", "train.warmup_steps=1"});
      for (int k = 0; k < 3; ++k)
        std::printf("%s single %.2f ms, multi-rank executor %.2f ms\n", f, world1_step_ms(s, false, 8),
                    world1_step_ms(s, true, 8));
    }
    return 0;
  }
  if (a.flag("--probe-only")) {
    for (int n : {2, 4, 8}) {
      std::printf("n=%d:", n);
      for (const auto& [k, v] : probe_collectives(n)) std::printf(" %s %.1fus", k.c_str(), v * 1e6);
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
                                   {"moe", cfg + "moe-layout.yaml", {}},
                                   {"llama", cfg + "llama-layout.yaml", {}}};
  std::vector<Row> rows = {{"S world 1", 0, 1, {"parallel.dp=1", "train.micro_batch=8"}},
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
        {"moe world 1", 2, 1, {"parallel.dp=1"}},
        {"ep2 (MoE)", 2, 2, {"parallel.dp=1", "parallel.ep=2"}},
        {"ep4 (MoE)", 2, 4, {"parallel.dp=1", "parallel.ep=4"}},
        {"ep2xdp2 (MoE)", 2, 4, {"parallel.dp=2", "parallel.ep=2"}},
        // The Llama block (RMSNorm, rotary positions, SwiGLU, grouped-query attention) at the
        // layout models' size: its 2 KV heads allow tp 1 or 2.
        {"llama world 1", 3, 1, {"parallel.dp=1"}},
        {"llama dp2", 3, 2, {"parallel.dp=2"}},
        {"llama tp2", 3, 2, {"parallel.dp=1", "parallel.tp=2"}},
        {"llama pp2 1f1b",
         3,
         2,
         {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"}},
        {"llama dp2xtp2", 3, 4, {"parallel.dp=2", "parallel.tp=2"}}};
    rows.insert(rows.end(), layouts.begin(), layouts.end());
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto t_all = Clock::now();

  // ---- the cost model: this machine's calibration (weft calibrate), one model for every
  // row; measured now (and cached) when there is none or --recalibrate asks ----
  const std::string cache = planner::machine_cache_path();
  std::string why;
  std::optional<planner::Hardware> hw;
  if (!a.flag("--recalibrate")) hw = planner::read_machine_cache(cache, planner::this_machine(), &why);
  if (hw) {
    std::printf("== cost model: this machine's calibration %s (%s; `weft calibrate` or --recalibrate to "
                "measure again)\n",
                cache.c_str(), hw->calibrated_at.c_str());
  } else {
    std::printf("== calibrating this machine (%s)\n", a.flag("--recalibrate") ? "--recalibrate" : why.c_str());
    CalibrationOptions co;
    co.progress = [](const std::string& line) { std::printf("  %s\n", line.c_str()), std::fflush(stdout); };
    hw = calibrate_machine(co);
    planner::write_machine_cache(*hw, cache);
    std::printf("  wrote %s\n", cache.c_str());
  }
  std::printf("cores %d, memory.bw %.2f GB/s, launch %.0f us, latency %.0f us, link bw %.2f GB/s, "
              "launch_oversub %.0f us, op_overhead %.2f us, GEMM %.2f-%.2f GFLOP/s by size (OPENBLAS_CORETYPE=%s)\n",
              hw->cores, hw->memory_bw / 1e9, hw->launch * 1e6, hw->intra.latency * 1e6, hw->intra.bw / 1e9,
              hw->launch_oversub * 1e6, hw->op_overhead * 1e6,
              hw->flops_by_size.empty() ? hw->flops_f32 / 1e9 : hw->flops_by_size.front().second / 1e9,
              hw->flops_by_size.empty() ? hw->flops_f32 / 1e9 : hw->flops_by_size.back().second / 1e9,
              hw->machine ? hw->machine->openblas_coretype.c_str() : "?");
  std::fflush(stdout);

  if (a.has("--attribute")) {
    const std::string name = a.get("--attribute");
    for (const Row& r : rows)
      if (r.name == name) {
        const Family& f = fam[size_t(r.family)];
        std::vector<std::string> sets = f.sets;
        sets.insert(sets.end(), r.sets.begin(), r.sets.end());
        return attribute_layout(f.config, sets, r.world, steps,
                                hw->cost_model(core::load_job_spec(f.config, f.sets).train.dtype),
                                int(a.get_int("--rank", 0)));
      }
    throw ConfigError("--attribute", "no row called '" + name + "': give one of the table's layout names");
  }
  // ---- runs ----
  for (Row& r : rows) {
    auto t0 = Clock::now();
    measure(r, fam[size_t(r.family)], steps);
    std::fprintf(stderr, "%s (world %d): %.1f s%s\n", r.name.c_str(), r.world, since(t0),
                 r.error.empty() ? "" : (" FAILED: " + r.error).c_str());
  }
  for (Row& r : rows) {
    try {
      const Family& f = fam[size_t(r.family)];
      const planner::CostModel cm = hw->cost_model(core::load_job_spec(f.config, f.sets).train.dtype);
      std::pair<double, double> split;
      r.predicted_ms = predict_ms(r, f, cm, &split);
      r.pred_compute_ms = split.first;
      r.pred_comm_ms = split.second;
      planner::CostModel plain = cm;
      plain.sync_wait_by_burst.clear();
      r.nowait_ms = predict_ms(r, f, plain);
      planner::CostModel flat = cm;
      flat.sync_wait_oversub_by_burst.clear();
      r.flat_oversub_ms = predict_ms(r, f, flat);
      planner::CostModel one = cm;
      one.sync_wait_oversub_more_by_burst.clear();
      r.one_curve_ms = predict_ms(r, f, one);
      planner::CostModel still = cm;
      still.wait_spread = 0;
      r.nodrift_ms = predict_ms(r, f, still);
    } catch (const std::exception& e) {
      if (r.error.empty()) r.error = std::string("plan: ") + e.what();
    }
  }

  std::printf(
      "\n== layouts (steps 1..%d; measured = the MEAN of the step times, as the model's waits are "
      "means; lower quartile and median beside it; error against the mean; r0 compute/comm: "
      "means; S: 4x256 seq 256 batch 8; others: configs/*-layout.yaml)\n",
      steps - 1);
  std::printf("%-20s | %5s | %28s | %12s | %8s | %19s | %19s\n", "layout", "world",
              "step ms mean / q1 / median", "predicted ms", "error", "r0 compute meas/pred",
              "r0 comm meas/pred");
  for (const Row& r : rows) {
    if (!r.error.empty() && !std::isfinite(r.measured_ms)) {
      std::printf("%-20s | %5d | %28s | %12.2f | %8s  (%s)\n", r.name.c_str(), r.world, "failed",
                  r.predicted_ms, "-", r.error.c_str());
      continue;
    }
    double err = (r.predicted_ms - r.measured_ms) / r.measured_ms * 100;
    std::printf("%-20s | %5d | %8.2f / %8.2f / %8.2f | %12.2f | %+7.1f%% | %8.2f / %8.2f | %8.2f / %8.2f%s%s%s\n",
                r.name.c_str(), r.world, r.measured_ms, r.q1_ms, r.median_ms, r.predicted_ms, err, r.compute_ms,
                r.pred_compute_ms, r.comm_ms, r.pred_comm_ms,
                r.fitted ? "  (weft calibrate fits op_overhead on this model at world 1)" : "",
                unsigned(r.world) > cores ? "  (oversubscribed)" : "",
                r.warning.empty() ? "" : ("  (warning: " + r.warning + ")").c_str());
  }
  // The accuracy figure: the median of |predicted - measured| / measured over every row that
  // ran, and over those that fit the cores (no time-sharing).
  std::vector<double> errs, errs_fit, nowait, nowait_fit, flat;
  for (const Row& r : rows) {
    if (!std::isfinite(r.measured_ms) || !std::isfinite(r.predicted_ms)) continue;
    const double e = std::fabs(r.predicted_ms - r.measured_ms) / r.measured_ms * 100;
    const double e0 = std::fabs(r.nowait_ms - r.measured_ms) / r.measured_ms * 100;
    errs.push_back(e), nowait.push_back(e0);
    flat.push_back(std::fabs(r.flat_oversub_ms - r.measured_ms) / r.measured_ms * 100);
    if (unsigned(r.world) <= cores) errs_fit.push_back(e), nowait_fit.push_back(e0);
  }
  std::printf("median |error| against the mean step: %.1f%% over the %zu layouts that ran; %.1f%% over the %zu within %u cores\n",
              median(errs), errs.size(), median(errs_fit), errs_fit.size(), cores);
  // The same predictions against the lower quartile, the statistic of the figures before
  // (docs/planner.md's table), on a line of its own: which statistic moved a figure.
  std::vector<double> q1_errs, q1_fit;
  for (const Row& r : rows) {
    if (!std::isfinite(r.q1_ms) || !std::isfinite(r.predicted_ms)) continue;
    q1_errs.push_back(std::fabs(r.predicted_ms - r.q1_ms) / r.q1_ms * 100);
    if (unsigned(r.world) <= cores) q1_fit.push_back(q1_errs.back());
  }
  std::printf("against the lower quartile instead (the statistic before): %.1f%% and %.1f%%\n",
              median(q1_errs), median(q1_fit));
  // The same runs under the model before sync_wait_by_burst, on lines of their own (no '|'
  // cells, no "label: " that reads as the tokens/s lines below), so that the rest reads as before.
  if (!hw->sync_wait_by_burst.empty()) {
    std::printf(
        "without the measured sync wait (the same runs predicted under this calibration less "
        "sync_wait_by_burst): %.1f%% and %.1f%%\n",
        median(nowait), median(nowait_fit));
    for (const Row& r : rows)
      if (std::isfinite(r.measured_ms) && std::isfinite(r.nowait_ms))
        std::printf("  %s -> predicted %.2f ms, %+.1f%%\n", r.name.c_str(), r.nowait_ms,
                    (r.nowait_ms - r.measured_ms) / r.measured_ms * 100);
  }
  // And under the model before sync_wait_oversub_by_burst (only the oversubscribed rows move).
  if (!hw->sync_wait_oversub_by_burst.empty()) {
    std::printf(
        "without the oversubscribed sync wait (the same runs predicted under this calibration "
        "less sync_wait_oversub_by_burst, i.e. launch_oversub per call): %.1f%% over all\n",
        median(flat));
    for (const Row& r : rows)
      if (std::isfinite(r.measured_ms) && std::isfinite(r.flat_oversub_ms) && unsigned(r.world) > cores)
        std::printf("  %s -> predicted %.2f ms, %+.1f%%\n", r.name.c_str(), r.flat_oversub_ms,
                    (r.flat_oversub_ms - r.measured_ms) / r.measured_ms * 100);
  }
  // And under the model before sync_wait_oversub_more_by_burst (the rows above its first
  // curve's ranks move).
  if (!hw->sync_wait_oversub_more_by_burst.empty()) {
    std::vector<double> one;
    for (const Row& r : rows)
      if (std::isfinite(r.measured_ms) && std::isfinite(r.one_curve_ms))
        one.push_back(std::fabs(r.one_curve_ms - r.measured_ms) / r.measured_ms * 100);
    std::printf(
        "without the oversubscribed curve at %d processes (the same runs predicted under this "
        "calibration less sync_wait_oversub_more_by_burst): %.1f%% over all\n",
        hw->sync_wait_oversub_more_ranks, median(one));
    for (const Row& r : rows)
      if (std::isfinite(r.measured_ms) && std::isfinite(r.one_curve_ms) && r.world > hw->sync_wait_oversub_ranks)
        std::printf("  %s -> predicted %.2f ms, %+.1f%% (with it %.2f ms, %+.1f%%)\n", r.name.c_str(),
                    r.one_curve_ms, (r.one_curve_ms - r.measured_ms) / r.measured_ms * 100, r.predicted_ms,
                    (r.predicted_ms - r.measured_ms) / r.measured_ms * 100);
  }
  // And under the model before the replicas' drift (CostModel::replica_drift): the figure
  // before and after in one run, on one calibration.
  auto spread_line = [&](const char* what, double Row::*ms) {
    std::vector<double> e, e_fit;
    for (const Row& r : rows) {
      if (!std::isfinite(r.measured_ms) || !std::isfinite(r.*ms)) continue;
      e.push_back(std::fabs(r.*ms - r.measured_ms) / r.measured_ms * 100);
      if (unsigned(r.world) <= cores) e_fit.push_back(e.back());
    }
    std::printf("%s (the same runs predicted under this calibration): %.1f%% and %.1f%%\n", what,
                median(e), median(e_fit));
    for (const Row& r : rows)
      if (std::isfinite(r.measured_ms) && std::isfinite(r.*ms) && r.*ms != r.predicted_ms)
        std::printf("  %s -> predicted %.2f ms, %+.1f%% (with it %.2f ms, %+.1f%%)\n",
                    r.name.c_str(), r.*ms, (r.*ms - r.measured_ms) / r.measured_ms * 100,
                    r.predicted_ms, (r.predicted_ms - r.measured_ms) / r.measured_ms * 100);
  };
  spread_line("without the replicas' drift (wait_spread 0)", &Row::nodrift_ms);
  // The same runs under other calibrations (--compare): how far the figure moves with the
  // calibration alone, the runs held fixed (the predictions are deterministic under a file).
  if (a.has("--compare")) {
    std::string list = a.get("--compare");
    for (size_t at = 0; at <= list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      const std::string file = list.substr(at, comma - at);
      at = comma + 1;
      if (file.empty()) continue;
      const planner::Hardware other = planner::load_hardware(file, "--compare");
      std::vector<double> e, e_fit;
      std::string cells;
      for (const Row& r : rows) {
        if (!std::isfinite(r.measured_ms)) continue;
        const Family& f = fam[size_t(r.family)];
        const double p =
            predict_ms(r, f, other.cost_model(core::load_job_spec(f.config, f.sets).train.dtype));
        const double err = (p - r.measured_ms) / r.measured_ms * 100;
        e.push_back(std::fabs(err));
        if (unsigned(r.world) <= cores) e_fit.push_back(std::fabs(err));
        char one[96];
        std::snprintf(one, sizeof one, "%s%s %+.1f%%", cells.empty() ? "" : ", ", r.name.c_str(),
                      err);
        cells += one;
      }
      std::printf("under %s: median |error| %.1f%% over all, %.1f%% within the cores (%s)\n",
                  file.c_str(), median(e), median(e_fit), cells.c_str());
    }
  }
  if (!quick)
    std::printf(
        "note: worlds over this machine's %u cores time-share them (one thread per rank); the "
        "model slows their compute by (ranks runnable at once)/cores and adds launch_oversub per call, "
        "or the calibrated sync_wait_oversub_by_burst where there is one, as far as the ranks runnable "
        "(not waiting for a pipeline message) outnumber the cores\n",
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
