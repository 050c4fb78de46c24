// The measurements behind `weft calibrate` and how they become a hardware description: GEMM
// rates by size, memcpy, the Gloo probe's latency and bandwidth fits, the executor's cost
// per instruction. Moved here from `weft bench scaling`, which calibrated in every run and
// then threw the model away.
#include "launch/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "base/check.h"
#include "base/config.h"
#include "base/cpu_time.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "comm/registry.h"
#include "core/cpu/kernels.h"
#include "core/exec/trainer.h"
#include "core/tensor.h"
#include "launch/bench_util.h"
#include "launch/calibration_recheck.h"
#include "launch/link_fit.h"
#include "parallel/launch_env.h"
#include "parallel/trainer.h"
#include "planner/calibration_check.h"
#include "planner/description_check.h"
#include "planner/planner.h"
#include "planner/simulate.h"

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;
using planner::CollKind;

// How long this process's threads have waited for a core (runnable, not running), seconds:
// the sum of each thread's run delay (/proc/self/task/*/schedstat, its second field; 0 where
// the kernel keeps none). Gloo's threads are among them: a wake-up that waits for a core
// another process holds is what a loaded machine adds to a synchronisation.
double run_delay_s() {
  double ns = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    if (std::FILE* f = std::fopen((e.path() / "schedstat").c_str(), "r")) {
      unsigned long long run = 0, wait = 0;
      if (std::fscanf(f, "%llu %llu", &run, &wait) == 2) ns += double(wait);
      std::fclose(f);
    }
  }
  return ns * 1e-9;
}

// Refits a wait curve that falls (refit_non_decreasing) and says so for the calibration's
// log, the refitted points listed; "" when it was plausible. `moved` gets the points moved.
std::string refit_wait_curve(std::vector<std::pair<double, double>>& curve, int& moved) {
  moved = refit_non_decreasing(curve);
  if (moved == 0) return "";
  std::string text = "; falling, refitted non-decreasing (" + std::to_string(moved) + " points):";
  for (const auto& [burst, wait] : curve) {
    char one[64];
    std::snprintf(one, sizeof one, " %.2f ms: %.0f us", burst * 1e3, wait * 1e6);
    text += one;
  }
  return text;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Single-thread SGEMM rate of one M x N x K product, FLOP/s, in the form a linear layer runs
// it: forward y = x w^T (trans_b), input gradient dx = dy w (plain), weight gradient
// dw = dy^T x (trans_a). Timed over 0.1 s in groups of calls of at least 1 ms, at the least
// thread CPU time per call of a group: a call another process preempted (a shared machine)
// is not what the product costs (as the kernels' rates take the least of 8 steps), and
// config S's 1 GFLOP product outlasts a time slice, so that beside a busy process no call of
// it ran whole. Groups, not single calls: the CPU clock's own cost (a system call, 0.56 us)
// and its jitter are a tenth of the smallest product's 5 us. `wall`: the rate at the least
// wall time per call of a group, recorded beside.
enum class GemmForm { kForward, kInputGrad, kWeightGrad };
struct GemmRate {
  double cpu = 0, wall = 0;
};
GemmRate gemm_flops(int64_t M, int64_t N, int64_t K, GemmForm form = GemmForm::kForward) {
  std::vector<float> a(size_t(M * K), 0.5f), b(size_t(K * N), 0.25f), c(size_t(M * N));
  const bool ta = form == GemmForm::kWeightGrad, tb = form == GemmForm::kForward;
  auto once = [&] {
    core::cpu::gemm<float>(ta, tb, M, N, K, 1.f, a.data(), ta ? M : K, b.data(), tb ? K : N, 0.f, c.data(), N);
  };
  once();
  int groups = 0;
  double least = 1e30, least_cpu = 1e30;
  const auto t0 = Clock::now();
  while (groups < 3 || since(t0) < 0.1) {
    const double c0 = thread_cpu_s();
    const auto t = Clock::now();
    int calls = 0;
    do once(), ++calls;
    while (since(t) < 1e-3);
    least = std::min(least, since(t) / calls);
    least_cpu = std::min(least_cpu, (thread_cpu_s() - c0) / calls);
    ++groups;
  }
  const double flop = 2.0 * double(M * N * K);
  return {flop / std::max(least_cpu, 1e-12), flop / least};
}

// Bytes moved per second by memcpy of 32 MiB (read + write), at the least of 4 copies into
// touched memory (bench_util.h's measure, which counts the bytes copied once).
double memcpy_bw() { return 2.0 * memcpy_bytes_per_second(size_t(32) << 20, 4); }

// Bytes moved per second by the element-wise add kernel on 8 MiB operands (two reads, one
// write): a memory-bound op, beside memcpy.
double add_bw() {
  const int64_t n = int64_t(2) << 20;
  std::vector<float> a(static_cast<size_t>(n), 1.f), b(a.size(), 2.f), y(a.size());
  core::cpu::add<float>(a.data(), b.data(), y.data(), n);
  auto t0 = Clock::now();
  for (int i = 0; i < 8; ++i) core::cpu::add<float>(a.data(), b.data(), y.data(), n);
  return 3.0 * 8 * double(n) * sizeof(float) / since(t0);
}

// Seconds of one call of `op` on every rank: the median over iterations of each rank's time,
// then the slowest rank's median. The median, not the mean: on a shared machine a call now
// and then waits milliseconds for a core that another process holds, and the model predicts
// the undisturbed step (weft bench scaling compares it with the lower quartile of the step
// times); a mean let a few such waits fit `launch` anywhere from 0 to 5.6 ms in one hour.
// `filler` (may be empty) runs before each call, untimed: with it, the call is timed while
// the other processes of the machine compute, as in a step.
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
  core::Tensor m = core::Tensor::from_vector<double>({1}, {median(v)});
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMax;
  world.all_reduce(m, o).wait();
  return m.data<double>()[0];
}

double physical_gib() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? double(pages) * double(size) / double(int64_t(1) << 30) : 0;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return b;
}

// The GEMM shapes measured (tokens x out x in): from the layout models' MLP (64 x 128 x 32)
// to config S's (2048 x 1024 x 256), so that tiny and large models both find their rate.
constexpr int64_t kGemmShapes[][3] = {{64, 128, 32},    {64, 32, 128},     {128, 256, 64},
                                      {256, 512, 128},  {512, 1024, 256},  {2048, 1024, 256}};

// The sync probe's bursts (probe_worker): name, calls, fillers (about 50 us each) before each.
struct SyncBurst {
  const char* name;
  int iters, burst;
};
// The mean of a few hundred calls still moves with one stall of a scheduler tick (4 ms) more
// or less: the short bursts, where a call is cheap, get the most calls (about 0.3 s each).
// Each loop's segments: at most kSyncSegments, of at least kSyncCallsPerSegment calls.
constexpr int kSyncSegments = 8, kSyncCallsPerSegment = 4;
constexpr SyncBurst kSyncBursts[] = {{"sync_ar_4B_b1", 800, 1},
                                     {"sync_ar_4B_b4", 400, 4},
                                     {"sync_ar_4B_b20", 100, 20},
                                     {"sync_ar_4B_b100", 30, 100},
                                     {"sync_ar_4B_b400", 10, 400}};
// The same loop with more processes than cores, on pairs (every process looping, as the
// tensor- and pipeline-parallel pairs of an oversubscribed layout run): a call costs a few
// ms there, so fewer calls give the same 0.3-0.6 s a point; no 400-filler point (a
// data-parallel step's long bursts: an oversubscribed tiny layout has none).
constexpr SyncBurst kSyncBurstsOversub[] = {{"sync_pair_4B_b1", 200, 1},
                                            {"sync_pair_4B_b4", 100, 4},
                                            {"sync_pair_4B_b20", 30, 20},
                                            {"sync_pair_4B_b100", 8, 100}};

// Each rated op type's kernel rate (CostModel::op_rates): a small model's training steps
// (config S's width on 2 layers, one micro-batch of 4 x 128 tokens) with the trainer's
// per-op-type profile, the least time of 8 steps per type, over the FLOPs op_work counts for
// that type's ops. The same kernels the executor runs, on operands a real step leaves in
// the caches, so that gelu's tanh, adamw's square roots and attention's softmax are priced
// at what they take rather than at the GEMM rate or memcpy's bandwidth. One model per
// architecture (kOpRateConfigs, under configs/), so that every rated type is run by a model
// that has it.
// The GPT first: the types both run (add, the loss, the embedding, AdamW, the gradient norm)
// keep its rates, as before the Llama was timed. The Llama adds RMSNorm, rotary positions,
// SwiGLU and grouped-query attention, forward and backward; the MoE-GPT its fused MoE layer
// (router, top-k, dispatch, expert MLPs, combine, balance loss), forward and backward. The
// MoE layer is timed at the layout models' shape (configs/moe-layout.yaml: 64 tokens of
// width 32 a micro-batch, 4 experts, top-2), the smallest this project trains: its rate by
// op_work's FLOPs depends on the shape more than the other kernels' (per-call work of the
// router and the gathers; 37 GFLOP/s there, 60 at moe-tiny's 128 tokens of width 64), and
// a layer priced at a larger shape's rate misses the small ones by a third.
// Then the Llama at the layout models' shape (configs/llama-layout.yaml): a second point
// for its own types (op_rates_by_size), as the MoE model gives the GPT's. With one point,
// from llama-small's width, its grouped-query attention at width 32 was priced at 70
// GFLOP/s where the GPT's attention there runs at 6.6, and llama world 1 was predicted
// 10-23% under its runs in every calibration.
constexpr const char* kOpRateConfigs[] = {"gpt-small.yaml", "llama-small.yaml", "moe-layout.yaml",
                                          "llama-layout.yaml"};

// One model's least seconds and op_work FLOPs per rated type. Seconds of the thread's CPU
// time in the type's kernels (the executor's profile_cpu): on a busy machine a step's wall
// time also holds the slices other processes took, which the least of 8 steps does not
// leave out when every step is preempted (beside two spinning loops config S's world-1 step
// was predicted 19-42% over its run); the wall time where it is less (below).
// `least_wall_s` gets the least wall time, recorded.
void profile_rated_ops(const char* config, std::array<double, planner::kRatedOps>& least_s,
                       std::array<double, planner::kRatedOps>& least_wall_s,
                       std::array<double, planner::kRatedOps>& flop,
                       std::array<double, planner::kRatedOps>& ops) {
  const core::JobSpec spec = core::load_job_spec(
      std::string(WEFT_SOURCE_DIR) + "/configs/" + config,
      {"model.layers=2", "train.global_batch=4", "train.micro_batch=4", "parallel.dp=1", "train.threads=1",
       "train.warmup_steps=1"});
  core::cpu::set_num_threads(1);
  core::Trainer t(spec);
  core::BatchFn batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    for (int64_t i = 0; i < n * spec.model.seq_len; ++i) {
      x[i] = int32_t((s * 131 + b0 * 17 + i * 7) % 256);
      y[i] = int32_t((s * 131 + b0 * 17 + i * 7 + 1) % 256);
    }
  };
  t.step(batch);  // first touch
  t.executor().set_profiling(true, /*thread_cpu=*/true);
  std::map<std::string, double> least, least_wall;
  auto keep_least = [](std::map<std::string, double>& into,
                       const std::map<std::string, double>& before,
                       const std::map<std::string, double>& after) {
    for (const auto& [type, secs] : after) {
      auto b = before.find(type);
      const double d = secs - (b == before.end() ? 0 : b->second);
      auto it = into.find(type);
      if (it == into.end() || d < it->second) into[type] = d;
    }
  };
  for (int k = 0; k < 8; ++k) {
    const std::map<std::string, double> before = t.executor().profile_cpu(),
                                        before_wall = t.executor().profile();
    t.step(batch);
    keep_least(least, before, t.executor().profile_cpu());
    keep_least(least_wall, before_wall, t.executor().profile());
  }
  const core::Graph& g = t.model().graph;
  flop = {}, ops = {};
  for (const core::Op& op : g.ops()) {
    std::vector<core::Shape> ins, outs;
    for (int v : op.inputs) ins.push_back(g.value(v).shape);
    for (int v : op.outputs) outs.push_back(g.value(v).shape);
    const planner::OpWork w = planner::op_work(op, "", ins, outs, core::dtype_size(core::DType::kF32));
    if (w.rated >= 0) flop[size_t(w.rated)] += w.flop, ops[size_t(w.rated)] += 1;
  }
  // The lesser of the two: the wall time exceeds a kernel's cost only by slices other
  // processes took, the CPU time only by its clock (a system call per op, its median cost
  // subtracted): at the layout models' width a type's ops take 0.3-4 us a step, where the
  // clock's misread moved the CPU time 15-36% between two calibrations and the wall time 1%.
  for (int i = 0; i < planner::kRatedOps; ++i) {
    auto it = least.find(planner::kRatedOpTypes[i]);
    auto w = least_wall.find(planner::kRatedOpTypes[i]);
    least_wall_s[size_t(i)] = w == least_wall.end() ? 0 : w->second;
    least_s[size_t(i)] = it == least.end() ? 0 : std::min(it->second, least_wall_s[size_t(i)]);
  }
}

std::string measure_op_rates(planner::Hardware& hw) {
  std::string out = "op rates (GFLOP/s as the model counts them, by the thread's CPU time):";
  std::array<bool, planner::kRatedOps> rated{};  // by an earlier model of kOpRateConfigs
  for (const char* config : kOpRateConfigs) {
    std::array<double, planner::kRatedOps> secs{}, wall{}, flop{}, ops{};
    profile_rated_ops(config, secs, wall, flop, ops);
    out += std::string(" [") + config + "]";
    for (int i = 0; i < planner::kRatedOps; ++i) {
      const size_t k = size_t(i);
      if (!(secs[k] > 0) || !(flop[k] > 0) || !(ops[k] > 0)) continue;
      // Every model that runs the type adds a point at its size (FLOPs of one op): the
      // layout models' width runs attention at a third of config S's rate.
      const double rate = flop[k] / secs[k], per_op = flop[k] / ops[k];
      auto& curve = hw.op_rates_by_size[k];
      if (std::none_of(curve.begin(), curve.end(), [&](const auto& p) { return p.first == per_op; }))
        curve.push_back({per_op, rate});
      std::sort(curve.begin(), curve.end());
      char one[96];
      std::snprintf(one, sizeof one, " %s %.1f", planner::kRatedOpTypes[i], rate / 1e9);
      out += one;
      const std::string model = std::filesystem::path(config).stem().string();
      std::string name = std::string("op_") + planner::kRatedOpTypes[i];
      if (rated[k]) name.append("_").append(model);
      hw.measurements.push_back({name + "_s", secs[k]});
      hw.measurements.push_back({name + "_wall_s", wall[k]});
      if (rated[k]) continue;
      // The first model's rate stays the type's single rate (read where no curve is).
      rated[k] = true;
      hw.op_rates[k] = rate;
    }
  }
  // One shape is no curve: op_rates holds it.
  for (auto& curve : hw.op_rates_by_size)
    if (curve.size() < 2) curve.clear();
  return out;
}

// The per-instruction cost of the plan executor: a small model's measured world-1 step
// through the executor, less the simulated step at the measured rates, per compute and local
// instruction. 0 (and said so) when the rates alone already overshoot.
double fit_op_overhead(planner::Hardware& hw, const CalibrationOptions& opt) {
  core::JobSpec spec = core::load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml",
                                           {"parallel.dp=1", "train.threads=1", "train.warmup_steps=1"});
  planner::PlanOptions po;
  po.cost = hw.cost_model(spec.train.dtype);
  po.cost.op_overhead = 0;
  po.simulate = false;
  core::ModelGraph mg = planner::build_planning_graph(spec);
  planner::Plan plan = planner::make_plan(spec, mg.graph, 1, po);
  const double raw_ms = planner::simulate_plan(plan, mg.graph, po.cost).step_s * 1e3;
  int64_t ops = 0;
  for (const planner::Instr& in : plan.roles.at(0).program)
    ops += in.kind == planner::InstrKind::kCompute || in.kind == planner::InstrKind::kLocal;
  auto t0 = Clock::now();
  // The least of three medians of the steps' CPU time: an undisturbed step. Their wall time
  // is recorded beside; on a busy machine it holds the time other processes held the core
  // (a calibration beside two spinning loops fitted op_overhead at 25 us where a quiet one
  // gives 3-4, and put gpt world 1 at +115..+227%). The first trainer of a process also runs
  // slower for a while (memory first touched): it is one of the three, never the only one.
  double measured_ms = 1e300, wall_ms = 1e300;
  for (int k = 0; k < 3; ++k) {
    double cpu = 0;
    wall_ms = std::min(wall_ms, world1_step_ms(spec, true, 12, &cpu));
    measured_ms = std::min(measured_ms, cpu);
  }
  hw.measurements.push_back({"executor_gpt_layout_step_s", measured_ms * 1e-3});
  hw.measurements.push_back({"executor_gpt_layout_step_wall_s", wall_ms * 1e-3});
  hw.measurements.push_back({"executor_gpt_layout_instructions", double(ops)});
  const double per_op = std::max(0.0, (measured_ms - raw_ms) * 1e-3 / double(std::max<int64_t>(1, ops)));
  char line[384];
  std::snprintf(
      line, sizeof line,
      "executor: configs/gpt-layout.yaml world-1 step %.2f ms measured (CPU time; wall %.2f), %.2f "
      "ms "
      "simulated at the measured rates, %lld instructions -> op_overhead %.2f us%s (%.1f s)",
      measured_ms, wall_ms, raw_ms, (long long)ops, per_op * 1e6,
      measured_ms < raw_ms ? " (the rates alone overshoot)" : "", since(t0));
  if (opt.progress) opt.progress(line);
  return per_op;
}

// The collective terms from the probes. Latency and bandwidth: the least-squares fit of
// every idle all-reduce and one-way message, at every size, of the worlds this machine's
// cores can run without oversubscription (link_fit.h). launch: what a 4 B all-reduce of 2
// computing processes takes beyond its 2 steps (a step's collectives wait for a core; the
// idle fit's launch is kept as a measurement). With more processes than cores,
// launch_oversub = the median excess of the busy calls.
std::string fit_collectives(const std::map<int, std::map<std::string, double>>& pr,
                            planner::Hardware& hw) {
  auto got = [&](int n, const std::string& k) {
    auto w = pr.find(n);
    if (w == pr.end()) return std::nan("");
    auto it = w->second.find(k);
    return it == w->second.end() ? std::nan("") : it->second;
  };
  const double ar2 = got(2, "ar_pair_4B_busy");
  if (!(std::isfinite(ar2) && ar2 > 0))
    throw Error("weft calibrate: the communication probe at 2 processes gave no busy all-reduce time");
  std::vector<LinkSample> samples;
  const std::pair<const char*, double> sizes[] = {
      {"4B", 4}, {"64KiB", 65536}, {"256KiB", 262144}, {"1MiB", 1048576}, {"4MiB", 4194304}};
  for (const auto& [n, m] : pr) {
    if (n > std::max(2, hw.cores)) continue;  // oversubscribed: launch_oversub's, below
    for (const auto& [tag, bytes] : sizes) {
      const double ar = got(n, std::string("ar_world_") + tag), p2p = got(n, std::string("p2p_") + tag);
      const std::string where = "n" + std::to_string(n) + " ";
      if (std::isfinite(ar))
        samples.push_back({1, 2.0 * (n - 1), 2.0 * (n - 1) / n * bytes, ar, where + "all-reduce " + tag});
      if (std::isfinite(p2p)) samples.push_back({0, 1, bytes, p2p, where + "message " + tag});
    }
  }
  const LinkFit f = fit_link(samples);  // leaves load outliers out (link_fit.h)
  hw.intra.latency = std::min(f.latency, 0.5 * ar2);  // no slower than half the 2-step all-reduce
  hw.intra.bw = f.bw;
  // A busy machine gave the busy call 3.8 ms in every repeat where the fit's call is 0.3 ms.
  const BusyLaunch busy = busy_launch(f, ar2, hw.intra.latency);
  const bool busy_loaded = busy.load_outlier;
  const double idle_ar2 = busy.idle_call;
  hw.launch = busy.launch;
  hw.measurements.push_back({"busy_all_reduce_load_outlier", busy_loaded ? 1.0 : 0.0});
  hw.measurements.push_back({"link_fit_idle_launch_s", f.launch});
  hw.measurements.push_back({"link_fit_samples", double(samples.size())});
  hw.measurements.push_back({"link_fit_rms_relative_error", f.rms_relative_error});
  hw.measurements.push_back({"link_fit_rejected", double(f.rejected.size())});
  // The first world above the cores (a later one probes the step-like loop only).
  int first_over = 0;
  for (const auto& [n, m] : pr)
    if (n > hw.cores && first_over == 0) first_over = n;
  std::vector<double> est;
  for (const auto& [n, m] : pr) {
    if (n != first_over || m.empty()) continue;
    const double a = got(n, "ar_pair_4B_busy"), w = got(n, "ar_world_4B_busy"), p = got(n, "p2p_4B_busy");
    if (std::isfinite(a)) est.push_back(a - hw.launch - 2 * hw.intra.latency);
    if (std::isfinite(w)) est.push_back(w - hw.launch - 2.0 * (n - 1) * hw.intra.latency);
    if (std::isfinite(p)) est.push_back(p - hw.intra.latency);
  }
  hw.launch_oversub = est.empty() ? 0 : std::max(0.0, median(est));
  // Each kind's own wire rate by size, at 2 processes: what a call of that kind and size
  // took beyond the model's fixed part (launch and steps at the fitted latency), so that the
  // model gives back each measured call. A size whose call took no longer than the fixed
  // part says nothing about bytes and is left out.
  std::string rates;
  const std::pair<CollKind, const char*> kinds[] = {
      {CollKind::kAllReduce, "ar"}, {CollKind::kAllGather, "ag"}, {CollKind::kReduceScatter, "rs"}};
  for (const auto& [kind, tag] : kinds) {
    auto& curve = hw.coll_bw_by_size[size_t(kind)];
    const double steps = kind == CollKind::kAllReduce ? 2 : 1;
    for (const auto& [size, bytes] : sizes) {
      const double t = got(2, std::string(tag) + "_world_" + size);
      const double beyond = t - hw.launch - steps * hw.intra.latency;
      if (!(bytes >= 65536 && std::isfinite(t) && beyond > 0)) continue;
      curve.push_back({bytes, double(planner::wire_bytes(kind, 2, int64_t(bytes))) / beyond});
      char one[64];
      std::snprintf(one, sizeof one, " %s %s %.2f", tag, size, curve.back().second / 1e9);
      rates += one;
    }
  }
  // One machine: no link to another node was measured; cross-node terms repeat the local ones.
  hw.inter = hw.intra;
  // The wait of a collective by the compute before it: what each synchronisation of the
  // step-like loop cost on average beyond the model's price of that call (a 4 B all-reduce
  // at 2 ranks: launch and two steps).
  std::string waits;
  const double price = hw.cost_model().collective(CollKind::kAllReduce, 2, 4, false);
  for (const SyncBurst& b : kSyncBursts) {
    const double t = got(2, b.name), burst = got(2, std::string(b.name) + "_burst");
    if (!(std::isfinite(t) && std::isfinite(burst) && burst > 0)) continue;
    if (!hw.sync_wait_by_burst.empty() && burst <= hw.sync_wait_by_burst.back().first) continue;
    hw.sync_wait_by_burst.push_back({burst, std::max(0.0, t - price)});
    char one[64];
    std::snprintf(one, sizeof one, " %.2f ms: %.0f us", burst * 1e3,
                  hw.sync_wait_by_burst.back().second * 1e6);
    waits += one;
  }
  int refit = 0;
  waits += refit_wait_curve(hw.sync_wait_by_burst, refit);
  // The same above the cores (the pairs' all-reduce): what each call cost beyond its price
  // without launch_oversub, which these curves replace; at the first probe world there
  // (sync_wait_oversub_by_burst) and at the largest beyond it
  // (sync_wait_oversub_more_by_burst).
  std::string over;
  auto oversub_curve = [&](int n, std::vector<std::pair<double, double>>& curve) {
    std::string one_world;
    for (const SyncBurst& b : kSyncBurstsOversub) {
      const double t = got(n, b.name), burst = got(n, std::string(b.name) + "_burst");
      if (!(std::isfinite(t) && std::isfinite(burst) && burst > 0)) continue;
      if (!curve.empty() && burst <= curve.back().first) continue;
      curve.push_back({burst, std::max(0.0, t - price)});
      char one[64];
      std::snprintf(one, sizeof one, " %.2f ms: %.0f us", burst * 1e3, curve.back().second * 1e6);
      one_world += one;
    }
    int moved = 0;
    one_world += refit_wait_curve(curve, moved);
    refit += moved;
    if (!one_world.empty()) over += " (" + std::to_string(n) + " processes, pairs)" + one_world;
    return !curve.empty();
  };
  if (first_over > 0 && oversub_curve(first_over, hw.sync_wait_oversub_by_burst)) {
    hw.sync_wait_oversub_ranks = first_over;  // every one of them looping: all runnable
    const int more = pr.rbegin()->first;
    if (more > first_over && oversub_curve(more, hw.sync_wait_oversub_more_by_burst))
      hw.sync_wait_oversub_more_ranks = more;
  }
  hw.measurements.push_back({"wait_curve_points_refitted", double(refit)});
  char line[512];
  std::snprintf(line, sizeof line,
                "link fit over %zu probes (least squares, relative): latency %.0f us, bw %.2f GB/s, "
                "idle launch %.0f us; rms error %.0f%%, worst %.0f%% (%s)",
                samples.size() - f.rejected.size(), f.latency * 1e6, f.bw / 1e9, f.launch * 1e6,
                100 * f.rms_relative_error, 100 * f.worst_relative_error, f.worst.c_str());
  std::string rejected;
  for (const std::string& r : f.rejected) rejected += (rejected.empty() ? "" : ", ") + r;
  if (busy_loaded) {
    std::snprintf(line + std::strlen(line), sizeof line - std::strlen(line),
                  "; the busy 4 B all-reduce (%.0f us) is over %.0fx the fit's %.0f us, a load outlier: "
                  "launch is the fit's",
                  ar2 * 1e6, kLoadOutlier, idle_ar2 * 1e6);
  }
  return std::string(line) + (rejected.empty() ? "" : "; left out as load outliers: " + rejected) +
         "\ncollective wire rates by kind and size (GB/s):" + rates +
         "\na collective's mean wait beyond its price, by the compute before it (2 processes):" +
         waits + (over.empty() ? "" : "\nthe same with more processes than cores" + over);
}

}  // namespace

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int probe_worker(const std::string& path, bool waits_only) {
  parallel::LaunchEnv env = parallel::detect_launch_env();
  parallel::WorkerWorld w(env, comm::Millis(120'000));
  comm::Communicator& c = w.comm();
  core::cpu::set_num_threads(1);
  const int n = c.size(), me = c.rank();
  WEFT_CHECK(n >= 2 && n % 2 == 0, "weft calibrate probe: an even world of 2 or more");
  std::unique_ptr<comm::Communicator> pair_owner = n > 2 ? c.split(me / 2, me % 2) : nullptr;
  comm::Communicator& pair = pair_owner ? *pair_owner : c;
  // The filler: the layout models' GEMM (64 x 128 x 32), ten times (~0.1-0.2 ms).
  std::vector<float> a(64 * 32, 0.5f), b(128 * 32, 0.25f), y(64 * 128);
  auto filler = [&] {
    for (int k = 0; k < 10; ++k)
      core::cpu::gemm<float>(false, true, 64, 128, 32, 1.f, a.data(), 32, b.data(), 32, 0.f, y.data(), 128);
  };
  core::Tensor small = core::Tensor::zeros({1}, core::DType::kF32);
  core::Tensor big = core::Tensor::zeros({int64_t(1) << 18}, core::DType::kF32);  // 1 MiB
  // The sizes of the link fit (link_fit.h), beside 4 B and 1 MiB.
  core::Tensor k64 = core::Tensor::zeros({int64_t(1) << 14}, core::DType::kF32);
  core::Tensor k256 = core::Tensor::zeros({int64_t(1) << 16}, core::DType::kF32);
  core::Tensor m4 = core::Tensor::zeros({int64_t(1) << 20}, core::DType::kF32);
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
  if (!waits_only) {
    out.push_back({"ar_world_4B", probe_time(c, 60, nullptr, ar(c, small), true)});
    out.push_back({"ar_world_64KiB", probe_time(c, 30, nullptr, ar(c, k64), true)});
    out.push_back({"ar_world_256KiB", probe_time(c, 20, nullptr, ar(c, k256), true)});
    out.push_back({"ar_world_1MiB", probe_time(c, 16, nullptr, ar(c, big), true)});
    out.push_back({"ar_world_4MiB", probe_time(c, 8, nullptr, ar(c, m4), true)});
    // All-gather and reduce-scatter at the same sizes: each collective kind runs its own
    // algorithm (Gloo's reduce-scatter is a ring all-reduce of the whole input and a slice;
    // its all-reduce is bcube up to 512 KiB and a ring above), so each gets its own fit.
    struct Sized {
      const char* tag;
      core::Tensor* whole;
      int iters;
    };
    const Sized sized[] = {{"64KiB", &k64, 30}, {"256KiB", &k256, 20}, {"1MiB", &big, 16}, {"4MiB", &m4, 8}};
    for (const Sized& z : sized) {
      core::Tensor part = core::Tensor::zeros({z.whole->numel() / n}, core::DType::kF32);
      core::Tensor& whole = *z.whole;
      out.push_back({std::string("ag_world_") + z.tag,
                     probe_time(c, z.iters, nullptr, [&] { c.all_gather(whole, part).wait(); }, true)});
      out.push_back({std::string("rs_world_") + z.tag,
                     probe_time(c, z.iters, nullptr, [&] { c.reduce_scatter(part, whole).wait(); }, true)});
    }
    // The tensor-parallel pattern: 64 KiB collectives between bursts of compute, no barrier.
    {
      core::Tensor part = core::Tensor::zeros({k64.numel() / n}, core::DType::kF32);
      out.push_back({"ar_world_64KiB_busy", probe_time(c, 30, filler, ar(c, k64), false)});
      out.push_back({"ag_world_64KiB_busy",
                     probe_time(c, 30, filler, [&] { c.all_gather(k64, part).wait(); }, false)});
      out.push_back({"rs_world_64KiB_busy",
                     probe_time(c, 30, filler, [&] { c.reduce_scatter(part, k64).wait(); }, false)});
    }
    out.push_back({"ar_pair_4B", probe_time(c, 60, nullptr, ar(pair, small), true)});
    out.push_back({"ar_world_4B_busy", probe_time(c, 60, filler, ar(c, small), false)});
    out.push_back({"ar_pair_4B_busy", probe_time(c, 60, filler, ar(pair, small), false)});
    out.push_back({"p2p_4B", probe_time(c, 60, nullptr, pingpong(small), true) / 2});
    out.push_back({"p2p_64KiB", probe_time(c, 30, nullptr, pingpong(k64), true) / 2});
    out.push_back({"p2p_1MiB", probe_time(c, 16, nullptr, pingpong(big), true) / 2});
    out.push_back({"p2p_4MiB", probe_time(c, 8, nullptr, pingpong(m4), true) / 2});
    out.push_back({"p2p_4B_busy", probe_time(c, 60, filler, pingpong(small), false) / 2});
  }
  // A step's pattern as the step pays it: a burst of compute, then a collective, `iters`
  // times over with no barrier; the mean of what each synchronisation cost beyond the rank's
  // own compute (the loop's time less its bursts', each burst timed), the slowest rank's.
  // A step pays every call, the slow ones included, and any skew between the ranks' bursts
  // (a thread descheduled or woken late) as a wait in the collective: the medians above
  // leave both out. At bursts from 50 us (tensor parallelism's, between its small
  // collectives) to 20 ms (a data-parallel step's compute before its gradient all-reduce):
  // CostModel::sync_wait_by_burst; above the cores on pairs, sync_wait_oversub_by_burst.
  // Each loop is timed in segments (name@k), each with the wait for a core that other
  // processes' work added to its calls (name@k_delay), so that `weft calibrate` can take it
  // out (load_robust_level). Two parts: the time the rank's threads (Gloo's included) were
  // runnable and not running during the calls (the run delay less the part within the
  // bursts), the most of the ranks; and each call's skew from the bursts' lost time (a
  // burst lengthened by a preemption keeps its peers waiting in the call): the longest
  // burst's lost time less the shortest's, call by call, over the group that synchronises.
  // `group` is that group (the world, or the pairs over the cores).
  auto sync_mean = [&](const char* name, int iters, int burst, comm::Communicator& group,
                       const std::function<void()>& op) {
    const int segments = std::clamp(iters / kSyncCallsPerSegment, 1, kSyncSegments);
    const int calls = iters / segments;
    // sync per call by segment, then the calls' run delay per call by segment, then the burst per
    // call
    std::vector<double> m(2 * size_t(segments) + 1, 0.0);
    std::vector<double> lost(size_t(segments) * size_t(calls),
                             0.0);  // each burst's wall less CPU time
    c.barrier().wait();
    for (int s = 0; s < segments; ++s) {
      double bursts = 0, burst_lost = 0;
      const double delay0 = run_delay_s();
      auto t0 = Clock::now();
      for (int i = 0; i < calls; ++i) {
        const double c0 = thread_cpu_s();
        auto tb = Clock::now();
        for (int k = 0; k < burst; ++k) filler();
        const double wall = since(tb);
        const double l = std::max(0.0, wall - (thread_cpu_s() - c0));
        bursts += wall, burst_lost += l;
        lost[size_t(s) * size_t(calls) + size_t(i)] = l;
        op();
      }
      m[size_t(s)] = (since(t0) - bursts) / calls;
      m[size_t(segments + s)] = std::max(0.0, run_delay_s() - delay0 - burst_lost) / calls;
      m.back() += bursts / (double(calls) * segments);
    }
    core::Tensor t = core::Tensor::from_vector<double>({int64_t(m.size())}, m);
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kMax;
    c.all_reduce(t, o).wait();
    core::Tensor most = core::Tensor::from_vector<double>({int64_t(lost.size())}, lost);
    core::Tensor least = core::Tensor::from_vector<double>({int64_t(lost.size())}, lost);
    group.all_reduce(most, o).wait();
    comm::AllReduceOptions lo;
    lo.op = comm::ReduceOp::kMin;
    group.all_reduce(least, lo).wait();
    std::vector<double> skew(size_t(segments), 0.0);
    for (size_t i = 0; i < lost.size(); ++i)
      skew[i / size_t(calls)] += (most.data<double>()[i] - least.data<double>()[i]) / calls;
    core::Tensor sk = core::Tensor::from_vector<double>({int64_t(segments)}, skew);
    c.all_reduce(sk, o).wait();  // the groups' most
    for (int s = 0; s < segments; ++s) {
      const std::string seg = std::string(name) + "@" + std::to_string(s);
      out.push_back({seg, t.data<double>()[s]});
      out.push_back({seg + "_delay", t.data<double>()[segments + s] + sk.data<double>()[s]});
    }
    out.push_back({std::string(name) + "_burst", t.data<double>()[2 * segments]});
  };
  if (n <= int(std::max(1u, std::thread::hardware_concurrency()))) {
    core::Tensor part = core::Tensor::zeros({k64.numel() / n}, core::DType::kF32);
    sync_mean("sync_ag_64KiB_b2", 400, 2, c, [&] { c.all_gather(k64, part).wait(); });
    for (const auto& [name, iters, burst] : kSyncBursts)
      sync_mean(name, iters, burst, c, [&] { c.all_reduce(small).wait(); });
  } else {
    // More processes than cores: CostModel::sync_wait_oversub_by_burst.
    for (const auto& [name, iters, burst] : kSyncBurstsOversub)
      sync_mean(name, iters, burst, pair, [&] { pair.all_reduce(small).wait(); });
  }
  auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) filler();
  out.push_back({"filler", since(t0) / 20});
  c.barrier().wait();
  if (me == 0) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw IoError("weft calibrate probe: cannot write " + path);
    for (const auto& [k, v] : out) std::fprintf(f, "%s %.9g\n", k.c_str(), v);
    std::fclose(f);
  }
  return 0;
}

std::map<std::string, double> probe_collectives(int n, bool waits_only) {
  std::map<std::string, double> out;
  char tmpl[] = "/tmp/weft-probe-XXXXXX";
  if (!::mkdtemp(tmpl)) return out;
  const std::string dir = tmpl;
  std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + shell_quote(self_exe()) +
                    " run --standalone --nproc-per-node " + std::to_string(n) + " -- weft calibrate --probe " +
                    shell_quote(dir + "/out") + (waits_only ? " --waits-only" : "") + " >" + shell_quote(dir + "/log") + " 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "communication probe on %d processes failed; log in %s/log\n", n, dir.c_str());
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

double world1_step_ms(const core::JobSpec& spec, bool multi_rank, int steps, double* cpu_ms) {
  core::cpu::set_num_threads(1);
  core::BatchFn batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    for (int64_t i = 0; i < n * spec.model.seq_len; ++i) {
      x[i] = int32_t((s * 131 + b0 * 17 + i * 7) % 256);
      y[i] = int32_t((s * 131 + b0 * 17 + i * 7 + 1) % 256);
    }
  };
  std::vector<double> ms, cpu;
  auto run = [&](auto& trainer) {
    for (int i = 0; i <= steps; ++i) {
      const double c0 = process_cpu_s();
      auto t0 = Clock::now();
      trainer.step(batch);
      if (i > 0) ms.push_back(since(t0) * 1e3), cpu.push_back((process_cpu_s() - c0) * 1e3);
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
  if (cpu_ms) *cpu_ms = median(cpu);
  return median(ms);
}

planner::Hardware calibrate_machine(const CalibrationOptions& opt) {
  auto say = [&](const std::string& s) {
    if (opt.progress) opt.progress(s);
  };
  char line[256];
  planner::Hardware hw;
  hw.name = "calibrated";
  hw.machine = planner::this_machine();
  hw.calibrated_at = utc_now();
  hw.cores = int(std::max(1u, std::thread::hardware_concurrency()));
  // Every rank of a local run shares this machine: one node, whatever the world.
  hw.ranks_per_node = 1 << 20;
  hw.memory_gib = physical_gib();
  core::cpu::set_num_threads(1);
  // Other processes' work lands in every number below (a Gloo wake-up waits for a core):
  // say so, and keep the load with the measurements.
  double load = 0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  hw.measurements.push_back({"load_average_1min", load});
  if (load > 0.5 * hw.cores) {
    std::snprintf(line, sizeof line,
                  "warning: this machine is busy (load average %.1f on %d cores): other processes' work "
                  "inflates what follows, the Gloo times most; calibrate again when it is quiet",
                  load, hw.cores);
    say(line);
  }

  auto t0 = Clock::now();
  hw.memory_bw = memcpy_bw();
  const double add = add_bw();
  hw.measurements.push_back({"memcpy_bytes_per_s", hw.memory_bw});
  hw.measurements.push_back({"add_bytes_per_s", add});
  std::snprintf(line, sizeof line, "memory: memcpy %.2f GB/s -> memory.bw; add kernel %.2f GB/s (%.1f s)",
                hw.memory_bw / 1e9, add / 1e9, since(t0));
  say(line);

  for (const auto& s : kGemmShapes) {
    t0 = Clock::now();
    // The three forms a linear layer runs (forward, input and weight gradient): their time
    // average, the rate of a training step's GEMMs of this size.
    const GemmRate f = gemm_flops(s[0], s[1], s[2], GemmForm::kForward),
                   i = gemm_flops(s[0], s[1], s[2], GemmForm::kInputGrad),
                   w = gemm_flops(s[0], s[1], s[2], GemmForm::kWeightGrad);
    const double rate = 3.0 / (1.0 / f.cpu + 1.0 / i.cpu + 1.0 / w.cpu);
    const double wall_rate = 3.0 / (1.0 / f.wall + 1.0 / i.wall + 1.0 / w.wall);
    const double flop = 2.0 * double(s[0] * s[1] * s[2]);
    const std::string shape =
        "gemm_" + std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]);
    hw.measurements.push_back({shape + "_flops", rate});
    hw.measurements.push_back({shape + "_wall_flops", wall_rate});
    // Two shapes of equal FLOPs: the curve keeps their mean.
    auto same = std::find_if(hw.flops_by_size.begin(), hw.flops_by_size.end(),
                             [&](const auto& p) { return p.first == flop; });
    if (same != hw.flops_by_size.end())
      same->second = 0.5 * (same->second + rate);
    else
      hw.flops_by_size.push_back({flop, rate});
    std::snprintf(line, sizeof line,
                  "gemm %lldx%lldx%lld (%.3g FLOPs), forward and both gradients: %.2f GFLOP/s (CPU "
                  "time; wall %.2f) (%.1f s)",
                  (long long)s[0], (long long)s[1], (long long)s[2], flop, rate / 1e9,
                  wall_rate / 1e9, since(t0));
    say(line);
  }
  std::sort(hw.flops_by_size.begin(), hw.flops_by_size.end());
  double best = 0;
  for (const auto& p : hw.flops_by_size) best = std::max(best, p.second);
  // One rate for a model without the curve (bf16 jobs: the CPU kernels were not measured in
  // bf16): the best measured.
  hw.flops_f32 = hw.flops_bf16 = best;

  std::map<int, std::map<std::string, double>> pr;
  // The repeats interleaved (2, 4, 8, 2, 4, 8, ...): a burst of another process's work lands
  // in one repeat of each world rather than in every repeat of one.
  ProbeRuns runs;
  std::map<int, double> probe_s;
  for (int rep = 0; rep < opt.probe_repeats; ++rep) {
    for (int n : opt.probe_worlds) {
      t0 = Clock::now();
      // Past the first world above the cores, only the step-like loop feeds the model.
      bool waits_only = false;
      for (int m : opt.probe_worlds) waits_only = waits_only || (m > hw.cores && m < n);
      std::map<std::string, double> one = probe_collectives(n, waits_only);
      if (one.empty())
        throw Error("weft calibrate: the Gloo probe on " + std::to_string(n) + " processes failed (log named above)");
      for (const auto& [k, v] : one) runs[n][k].push_back(v);
      probe_s[n] += since(t0);
    }
  }
  // The collectives the model is fitted from must not contradict themselves
  // (planner/calibration_check.h): a world that does is probed again, and a contradiction
  // that outlasts those probes refuses the calibration (calibration_recheck.h).
  const CollectiveRecheck recheck = recheck_collectives(
      runs, hw.cores,
      [&](int n) {
        const auto t = Clock::now();
        std::map<std::string, double> one = probe_collectives(n);
        probe_s[n] += since(t);
        return one;
      },
      kMaxRemeasures, say);
  if (!recheck.left.empty()) throw Error(refusal_message(recheck));
  {
    std::string judged, more;
    for (int n : opt.probe_worlds)
      if (planner::judged_world(n, hw.cores))
        judged += (judged.empty() ? "" : ", ") + std::to_string(n);
    for (const auto& [n, k] : recheck.remeasured)
      more += "; " + std::to_string(k) + " more probes at " + std::to_string(n) + " processes";
    std::snprintf(line, sizeof line, "collectives consistent (%s, %s, within %.1fx) at ",
                  planner::kDecompositionRule, planner::kBytesRule, planner::collective_spread());
    say(line + judged + " processes" + more);
  }
  for (int n : opt.probe_worlds) {
    const auto more = recheck.remeasured.find(n);
    hw.measurements.push_back(
        {"gloo_n" + std::to_string(n) + "_probes",
         double(opt.probe_repeats + (more == recheck.remeasured.end() ? 0 : more->second))});
  }
  for (int n : opt.probe_worlds) {
    // A shared machine delays a wake-up now and then, and another process's burst of work
    // can hold a core through a whole probe: a call's time is the least of a few probes (as
    // the kernels' rates take the least of 8 steps), what the call costs undisturbed; so is
    // a loop's burst (the compute the model prices). The step-like loops (sync_*) keep the
    // mean of their segments less the load outliers (load_robust_level): their means are
    // the waits a step pays, slow calls included (CostModel::sync_wait_by_burst).
    std::string s = "gloo, " + std::to_string(n) + " processes (least of " +
                    std::to_string(runs[n].empty() ? 0 : runs[n].begin()->second.size()) +
                    "; sync_*: the mean of the least-delayed quarter of the segments):";
    int kept = 0, rejected = 0;
    auto delay_key = [](const std::string& k) {
      return k.size() > 6 && k.compare(k.size() - 6, 6, "_delay") == 0;
    };
    for (const auto& [k, v] : runs[n]) {
      const size_t at = k.find('@');
      if (at != std::string::npos) continue;  // a segment: its loop's level, below
      pr[n][k] = *std::min_element(v.begin(), v.end());
    }
    for (const auto& [k, v] : runs[n]) {
      const size_t at = k.find('@');
      if (at == std::string::npos || delay_key(k) || pr[n].count(k.substr(0, at))) continue;
      // Every segment of this loop, over the repeats, each with its delay: the least-delayed
      // quarter gives the level, over the cores too (loop_segments). Before the communication
      // threads' short slice (comm/gloo/thread_slice.h) every segment was kept there (the
      // quarter priced those layouts 30-55% under); with it they run 0.47-0.93x as long, and
      // every segment put the ten rows over the cores at 34-50% (median |error|) where the
      // quarter gives 10-20% (docs/planner.md, "after the short slice").
      const LoadRobustLevel l = load_robust_level(loop_segments(runs[n], k.substr(0, at)));
      pr[n][k.substr(0, at)] = l.value;
      pr[n][k.substr(0, at) + "_raw"] = l.raw;  // every segment's mean
      kept += l.kept, rejected += l.rejected;
    }
    hw.measurements.push_back({"gloo_n" + std::to_string(n) + "_sync_segments_kept", double(kept)});
    hw.measurements.push_back(
        {"gloo_n" + std::to_string(n) + "_sync_segments_rejected", double(rejected)});
    std::snprintf(line, sizeof line,
                  " (sync segments: %d kept, %d left out as delayed or outliers)", kept, rejected);
    s += line;
    for (const auto& [k, v] : pr[n]) {
      hw.measurements.push_back({"gloo_n" + std::to_string(n) + "_" + k + "_s", v});
      std::snprintf(line, sizeof line, " %s %.0fus", k.c_str(), v * 1e6);
      s += line;
    }
    std::snprintf(line, sizeof line, " (%.1f s)", probe_s[n]);
    say(s + line);
  }
  say(fit_collectives(pr, hw));
  std::snprintf(line, sizeof line,
                "-> launch %.0f us, latency %.0f us, bw %.2f GB/s, launch_oversub %.0f us (%d cores)",
                hw.launch * 1e6, hw.intra.latency * 1e6, hw.intra.bw / 1e9, hw.launch_oversub * 1e6, hw.cores);
  say(line);
  t0 = Clock::now();
  const std::string rates = measure_op_rates(hw);
  std::snprintf(line, sizeof line, " (%.1f s)", since(t0));
  say(rates + line);
  hw.op_overhead = fit_op_overhead(hw, opt);
  // The model fitted from consistent calls can still contradict itself between them (a curve
  // interpolated between two sizes, a rate that the fixed terms leave out): the loader would
  // not use it (planner::read_machine_cache), so it is refused here and nothing is written.
  if (const auto bad = planner::check_description(hw); !bad.empty())
    throw Error("weft calibrate: the model fitted from these measurements contradicts itself (" +
                planner::describe(bad) + "); nothing written, run it again");
  return hw;
}

}  // namespace weft::launch
