// `weft bench search`: the plan search's top candidates trained on real local ranks (the
// machinery of `weft bench scaling`, bench_util.h run_layout), so that the search's ranking
// is checked against measured step times on this machine, under the cost model `weft plan`
// uses (this machine's calibration when there is one).
#include "launch/bench_search.h"

#include <stdlib.h>  // getloadavg
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/config.h"
#include "base/error.h"
#include "core/config/job_spec.h"
#include "launch/args.h"
#include "launch/bench_util.h"
#include "planner/hardware.h"
#include "planner/search.h"

namespace weft::launch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kHelp =
    R"(usage: weft bench search [--quick] [--steps N] [--config FILE] [--world N] [--top K]
                         [--rounds R] [--set KEY=VALUE]... [--all-variants]
  runs the plan search for a small GPT (every searched key auto: tp, pp, ep, zero,
  recompute, sequence parallelism, schedule, virtual stages, pipeline layout, micro-batch),
  trains its top K candidates and the Megatron-style default (tp = a node, 1F1B,
  micro_batch 1, ZeRO-1, selective recompute) when it is not among them, each on real local
  ranks (`weft run --standalone`, one process and one BLAS thread per rank), and prints per
  candidate the predicted step (the search's stage model, which counts the trainer's
  statistics exchange), the measured step (the median step_ms after the first step; with rounds, the
  least of the rounds' medians), the error and both rankings; then the searched
  (top-predicted) plan's measured step over the best measured one, and the median |error|.
  Cost model: `weft plan`'s, this machine's calibration (`weft calibrate`) when there is one,
  else the rough H100 defaults; the `cost model:` line says which. The runs inherit the
  environment as it is (OPENBLAS_CORETYPE included), as the calibration did.
  --quick          configs/gpt-layout.yaml (8 x 32, seq 16, batch 16), top 2, 3 steps, 1 round
  --steps N        steps per run (default 20; the first is not timed)
  --rounds R       run every candidate R times, in alternating order, and keep each one's
                   least median (default 2): on a shared machine another process's burst
                   slows a run, never speeds one up
  --config FILE    the model and training keys (default configs/gpt-small.yaml: 4 x 128,
                   seq 128, batch 16); its parallel keys are searched
  --world N        ranks, one process each (default 2: a rank per core on a 2-core machine)
  --top K          candidates taken from the search (default 5)
  --set KEY=VALUE  fix a key instead of searching it, e.g. --set parallel.zero=0 (repeatable)
  --all-variants   the search's raw top K; by default only the best-predicted candidate of
                   each shape (degrees, schedule, virtual stages, sequence parallelism,
                   micro-batch) is taken: ZeRO stages and recompute modes of one shape are
                   predicted within a few % of each other at these sizes, closer than
                   run-to-run noise here
)";

// Every key the search may choose, left to it (the file's values would otherwise stay fixed).
const std::vector<std::string> kSearchAll = {
    "parallel.plan=search", "parallel.dp=auto", "parallel.tp=auto", "parallel.pp=auto",
    "parallel.ep=auto", "parallel.zero=auto", "parallel.recompute=auto",
    "parallel.pipeline.schedule=auto", "parallel.pipeline.virtual_stages=auto",
    "parallel.pipeline.layout=auto", "parallel.sequence_parallel=auto", "train.micro_batch=auto",
    // The calibration and the runs are one BLAS thread per rank.
    "train.threads=1"};

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool same_layout(const planner::Layout& a, const planner::Layout& b) {
  return a.deg == b.deg && a.zero == b.zero && a.schedule == b.schedule &&
         a.recompute == b.recompute && a.virtual_stages == b.virtual_stages &&
         a.micro_batch == b.micro_batch && a.chunk_layers == b.chunk_layers &&
         a.sequence_parallel == b.sequence_parallel;
}

bool same_shape(const planner::Layout& a, const planner::Layout& b) {
  return a.deg == b.deg && a.schedule == b.schedule && a.virtual_stages == b.virtual_stages &&
         a.micro_batch == b.micro_batch && a.sequence_parallel == b.sequence_parallel;
}

// "dp2 tp1 pp2 1f1b mb4 zero0 none layers 3/1": everything the trainer is given.
std::string label(const planner::Layout& l) {
  std::string s = "dp" + std::to_string(l.deg.dp) + " tp" + std::to_string(l.deg.tp) + " pp" +
                  std::to_string(l.deg.pp);
  if (l.deg.ep > 1) s += " ep" + std::to_string(l.deg.ep);
  s += " " + l.schedule;
  if (l.virtual_stages > 1) s += " v" + std::to_string(l.virtual_stages);
  if (l.sequence_parallel) s += " sp";
  s += " mb" + std::to_string(l.micro_batch) + " zero" + std::to_string(l.zero) + " " + l.recompute;
  if (l.deg.pp > 1) {
    s += " layers ";
    for (size_t i = 0; i < l.chunk_layers.size(); ++i) {
      if (i) s += '/';
      s += std::to_string(l.chunk_layers[i]);
    }
  }
  return s;
}

struct Row {
  planner::Candidate cand;
  bool megatron = false;
  double predicted_ms = std::nan(""), measured_ms = std::nan("");
  // The same candidate under the model without CostModel::sync_wait_by_burst (the model
  // before it), beside: the measured wait's share of the figures from one set of runs.
  double nowait_ms = std::nan("");
  int rank_pred = 0, rank_meas = 0;  // 1-based; 0: not ranked (the run failed)
  std::string error, warning;
};

// 1-based ranks of `key` over the rows where it is finite, ascending, ties in row order.
template <class Key>
void rank_rows(std::vector<Row>& rows, Key key, int Row::*out) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < rows.size(); ++i)
    if (std::isfinite(key(rows[i]))) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return key(rows[a]) < key(rows[b]); });
  for (size_t r = 0; r < idx.size(); ++r) rows[idx[r]].*out = int(r) + 1;
}

// CPU seconds of the reaped children (std::system's `weft run` and, through it, the ranks).
double children_cpu_s() {
  struct rusage u;
  ::getrusage(RUSAGE_CHILDREN, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double load_1min() {
  double l[1] = {-1};
  return ::getloadavg(l, 1) == 1 ? l[0] : -1;
}

}  // namespace

int run_search_bench(const std::vector<std::string>& argv) {
  Args a(std::vector<std::string>(argv.begin() + 1, argv.end()),
         {"--steps", "--rounds", "--config", "--world", "--top", "--set"},
         {"--quick", "--help", "--all-variants"});
  if (a.flag("--help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const bool quick = a.flag("--quick");
  const int steps = int(a.get_int("--steps", quick ? 3 : 20));
  if (steps < 2) throw ConfigError("--steps", "give at least 2: the first step is not timed");
  const int64_t rounds = a.get_int("--rounds", quick ? 1 : 2);
  if (rounds < 1 || rounds > 20) throw ConfigError("--rounds", "expected 1..20 rounds");
  const int64_t world = a.get_int("--world", 2);
  if (world < 1 || world > 64) throw ConfigError("--world", "expected 1..64 local ranks");
  const int64_t top = a.get_int("--top", quick ? 2 : 5);
  if (top < 1 || top > 32) throw ConfigError("--top", "expected 1..32 candidates");
  const std::string config =
      a.get_or("--config", std::string(WEFT_SOURCE_DIR) + "/configs/" +
                               (quick ? "gpt-layout.yaml" : "gpt-small.yaml"));
  std::vector<std::string> sets = kSearchAll;
  for (const std::string& s : a.all("--set")) sets.push_back(s);
  const core::JobSpec spec = core::load_job_spec(config, sets);
  const auto t_all = Clock::now();

  // ---- the cost model, as `weft plan` chooses it ----
  std::string used;
  planner::SearchOptions so;
  so.cost = planner::choose_cost_model("", spec.train.dtype, &used);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("cost model: %s\n", used.c_str());
  std::printf(
      "OPENBLAS_CORETYPE=%s for the search's model and every run (the environment as it is); "
      "load average %.1f at the start\n",
      coretype ? coretype : "(unset)", load_1min());

  // ---- the search: its top K (best first), then Megatron-style defaults ----
  so.top = a.flag("--all-variants") ? int(top) : 1 << 20;  // all of them, to pick shapes
  const planner::SearchResult sr = planner::search_plan(spec, int(world), so);
  std::vector<Row> rows;
  for (const planner::Candidate& c : sr.top) {
    if (int64_t(rows.size()) == top) break;
    bool seen = false;
    for (const Row& r : rows) seen = seen || same_shape(r.cand.layout, c.layout);
    if (seen && !a.flag("--all-variants")) continue;
    rows.push_back({c});
  }
  std::string megatron_note;
  try {
    const planner::Candidate m = planner::megatron_baseline(spec, int(world), so);
    size_t at = rows.size();
    for (size_t i = 0; i < rows.size(); ++i)
      if (same_layout(rows[i].cand.layout, m.layout)) at = i;
    if (at == rows.size())
      rows.push_back({m, true});
    else
      rows[at].megatron = true;
  } catch (const ConfigError& e) {
    megatron_note = std::string("no Megatron-style default: ") + e.what();
  }
  std::printf(
      "plan search: %s at world %lld, %lld candidates costed, %lld under the cap, %.2f s; "
      "%zu to train (%s)\n",
      config.c_str(), (long long)world, (long long)sr.evaluated, (long long)sr.fitting, sr.seconds,
      rows.size(), a.flag("--all-variants") ? "the raw top K" : "the best of each shape");
  if (!megatron_note.empty()) std::printf("%s\n", megatron_note.c_str());
  for (Row& r : rows) r.predicted_ms = r.cand.pred.step_s * 1e3;
  const bool waits = !so.cost.sync_wait_by_burst.empty();
  if (waits) {
    planner::SearchOptions plain = so;
    plain.cost.sync_wait_by_burst.clear();
    const planner::SearchResult pr = planner::search_plan(spec, int(world), plain);
    std::vector<planner::Candidate> all = pr.top;
    try {
      all.push_back(planner::megatron_baseline(spec, int(world), plain));
    } catch (const ConfigError&) {
    }
    for (Row& r : rows)
      for (const planner::Candidate& c : all)
        if (same_layout(c.layout, r.cand.layout)) r.nowait_ms = c.pred.step_s * 1e3;
  }

  // ---- the runs: each candidate's job written out whole, trained for `steps` steps ----
  std::string tmpl = "/tmp/weft-search-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw IoError("weft bench search: cannot create a temporary folder");
  const std::string dir = tmpl;
  std::printf("\n== runs (%d steps each on %lld ranks, %lld round%s)\n", steps, (long long)world,
              (long long)rounds, rounds > 1 ? "s, alternating order" : "");
  std::fflush(stdout);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string path = dir + "/candidate-" + std::to_string(i + 1) + ".yaml";
    std::ofstream f(path);
    f << core::job_spec_to_yaml(planner::apply_layout(spec, rows[i].cand.layout));
    if (!f) throw IoError("cannot write " + path);
  }
  for (int64_t round = 0; round < rounds; ++round)
    for (size_t k = 0; k < rows.size(); ++k) {
      // Odd rounds run backwards, so that a slow spell of the machine does not always fall
      // on the same candidates.
      const size_t i = round % 2 ? rows.size() - 1 - k : k;
      Row& r = rows[i];
      if (!r.error.empty()) continue;  // failed once: not run again
      const auto t0 = Clock::now();
      const double cpu0 = children_cpu_s();
      const LayoutTimes t = run_layout(dir + "/candidate-" + std::to_string(i + 1) + ".yaml", {},
                                       int(world), steps, "search");
      // fmin ignores the NaN a row starts with; a failed round fails the row.
      r.measured_ms = t.error.empty() ? std::fmin(r.measured_ms, t.median_ms) : std::nan("");
      r.error = t.error;
      if (!t.warning.empty()) r.warning = t.warning;
      char measured[64];
      std::snprintf(measured, sizeof measured, "%.2f ms", t.median_ms);
      // How much CPU the run got: on a shared machine, a run whose ranks had less than a core
      // each was slowed by others' work, which no cost model sees.
      const double wall = since(t0), cores = (children_cpu_s() - cpu0) / wall;
      std::printf(
          "[%zu/%zu]%s %s: predicted %.2f ms, measured %s (%.1f s; its processes used "
          "%.2f cores, load average %.1f)\n",
          i + 1, rows.size(), rounds > 1 ? (" round " + std::to_string(round + 1)).c_str() : "",
          label(r.cand.layout).c_str(), r.predicted_ms,
          r.error.empty() ? measured : ("FAILED: " + r.error).c_str(), wall, cores, load_1min());
      std::fflush(stdout);
    }
  bool failed = false;
  for (const Row& r : rows) failed = failed || !r.error.empty();
  // A failed run's log (kept by run_layout) names its candidate's job file: keep those too.
  if (failed)
    std::printf("candidates' job files kept in %s\n", dir.c_str());
  else
    std::filesystem::remove_all(dir);

  // ---- the table ----
  rank_rows(
      rows, [](const Row& r) { return r.predicted_ms; }, &Row::rank_pred);
  rank_rows(
      rows, [](const Row& r) { return r.measured_ms; }, &Row::rank_meas);
  std::printf(
      "\n== candidates (predicted: the search's stage model, the trainer's statistics exchange "
      "included; measured: median step_ms of steps 1..%d%s; error = (pred - meas) / meas)\n",
      steps - 1, rounds > 1 ? ", the least of the rounds'" : "");
  std::printf("%-3s | %-62s | %12s | %11s | %8s | %9s | %9s\n", "#", "layout", "predicted ms",
              "measured ms", "error", "pred rank", "meas rank");
  std::vector<double> errs;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::string name = label(r.cand.layout);
    if (r.megatron) name += " (Megatron-style)";
    if (!std::isfinite(r.measured_ms)) {
      std::printf("%-3zu | %-62s | %12.3f | %11s | %8s | %9d | %9s  (%s)\n", i + 1, name.c_str(),
                  r.predicted_ms, "failed", "-", r.rank_pred, "-", r.error.c_str());
      continue;
    }
    const double err = (r.predicted_ms - r.measured_ms) / r.measured_ms * 100;
    errs.push_back(std::fabs(err));
    std::printf("%-3zu | %-62s | %12.3f | %11.3f | %+7.1f%% | %9d | %9d%s\n", i + 1, name.c_str(),
                r.predicted_ms, r.measured_ms, err, r.rank_pred, r.rank_meas,
                r.warning.empty() ? "" : ("  (warning: " + r.warning + ")").c_str());
  }
  std::printf("\n");

  // ---- the figures: the searched plan against the best measured, and the median error ----
  // The search's choice, what `parallel.plan: search` trains: its first candidate, the top
  // predicted (the Megatron-style row is priced by the same model and cannot beat it).
  const Row* searched = rows.empty() ? nullptr : &rows[0];
  const Row* best = nullptr;
  for (const Row& r : rows)
    if (r.rank_meas == 1) best = &r;
  if (searched && best && std::isfinite(searched->measured_ms)) {
    const double ratio = searched->measured_ms / best->measured_ms;
    std::printf(
        "searched / best measured: %.4fx (searched #%td %.3f ms, best #%td %.3f ms; issue "
        "17's target: <= 1.10x)\n",
        ratio, searched - rows.data() + 1, searched->measured_ms, best - rows.data() + 1,
        best->measured_ms);
  } else {
    std::printf("searched / best measured: not measured (a run failed)\n");
  }
  if (errs.empty())
    std::printf("median |prediction error|: - (no candidate measured)\n");
  else
    std::printf("median |prediction error|: %.1f%% over %zu candidates\n", median(errs),
                errs.size());
  // The same runs under the model before sync_wait_by_burst, after the figures (and without
  // the table's '|' cells), so that the table and its figures read as before.
  if (waits) {
    std::printf(
        "\n== without the measured sync wait (the same runs predicted under this calibration "
        "less sync_wait_by_burst)\n");
    std::vector<double> errs_nowait;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      if (!std::isfinite(r.measured_ms) || !std::isfinite(r.nowait_ms)) continue;
      const double e = (r.nowait_ms - r.measured_ms) / r.measured_ms * 100;
      errs_nowait.push_back(std::fabs(e));
      std::printf("  #%zu %s -> predicted %.3f ms, %+.1f%%\n", i + 1, label(r.cand.layout).c_str(),
                  r.nowait_ms, e);
    }
    if (!errs_nowait.empty())
      std::printf("  median |prediction error| without it: %.1f%% over %zu candidates\n",
                  median(errs_nowait), errs_nowait.size());
  }
  std::printf("load average %.1f at the end; total %.1f s\n", load_1min(), since(t_all));
  return failed ? 1 : 0;
}

}  // namespace weft::launch
