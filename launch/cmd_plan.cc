// `weft plan`: build, validate and simulate the plan of a job for a world size; print which
// layers, experts and shards live on which rank, per-rank communication, step time, peak
// memory and bubble (or the plan as JSON), and optionally draw the timeline.
#include <chrono>
#include <cstdio>
#include <fstream>

#include "base/error.h"
#include "core/config/job_spec.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "planner/hardware.h"
#include "planner/plan_json.h"
#include "planner/planner.h"
#include "planner/report.h"
#include "planner/search.h"
#include "planner/simulate.h"
#include "planner/validate.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp = R"(usage: weft plan --config FILE.yaml --world N [options]

  --config FILE         the job's YAML file (required)
  --world N             number of ranks to plan for (required)
  --set a.b=value       override a key (repeatable), e.g. --set parallel.tp=4
  --json                print the plan as JSON instead of the report
  --out PLAN.json       also write the plan as JSON to this file
  --timeline OUT.svg    draw every rank's schedule, under a time axis
  --timeline-zoom A:B   draw only the window from A to B ms after the step's start
  --timeline-ranks L    ranks to draw, e.g. 0-7 or 0,4,8 (default: all up to 32, else the
                        ranks of data-parallel replica 0); rows with many spans are aggregated
  --per-rank            one report line per rank even for large worlds
  --compare-megatron    print the searched layout against Megatron-style defaults (tp = a
                        node, pp from memory, dp the rest) on the same cost model, and stop
plan search (parallel.plan: search, or auto on tp, pp, ep, zero, schedule, virtual_stages,
layout, recompute, sequence_parallel, train.micro_batch): prints the top candidates, then plans the best one;
the cap per rank is memory.limit_gib, else --memory-gib
cost model: --hardware h100|h200|FILE (configs/hardware/, docs/planner.md); without it, this
machine's calibration (`weft calibrate`) when there is one, else a rough H100 node. The
flags below then set single fields (defaults shown for the rough H100 node):
  --hardware H          a preset or a hardware description file
  --flops F             sustained FLOP/s per device (4e14)
  --bw-intra B          bytes/s per rank inside a node (1.5e11)   --alpha-intra S (1e-6)
  --bw-inter B          bytes/s per rank across nodes (2.5e10)    --alpha-inter S (1e-5)
  --launch S            fixed cost of every collective (1e-5)
  --ranks-per-node N    (8)
  --memory-gib G        memory budget per rank (80); a plan over it exits with code 2
)";

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double number(const Args& a, const std::string& opt, double fallback) {
  if (!a.has(opt)) return fallback;
  try {
    return std::stod(a.get(opt));
  } catch (const std::exception&) {
    throw ConfigError(opt, "expected a number, got '" + a.get(opt) + "'");
  }
}

// "0-7", "0,4,8" or a mix: the ranks --timeline-ranks names.
std::vector<int> rank_list(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t dash = item.find('-');
    try {
      size_t used = 0;
      const int lo = std::stoi(item.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? item.size() : dash) || lo < 0) throw std::invalid_argument("");
      int hi = lo;
      if (dash != std::string::npos) {
        hi = std::stoi(item.substr(dash + 1), &used);
        if (used != item.size() - dash - 1 || hi < lo || hi - lo > (1 << 20)) throw std::invalid_argument("");
      }
      for (int r = lo; r <= hi; ++r) out.push_back(r);
    } catch (const std::exception&) {
      throw ConfigError("--timeline-ranks", "expected ranks like 0-7 or 0,4,8, got '" + text + "'");
    }
    at = comma + 1;
  }
  return out;
}

planner::TimelineOptions timeline_options(const Args& a) {
  planner::TimelineOptions t;
  if (a.has("--timeline-zoom")) {
    const std::string z = a.get("--timeline-zoom");
    const size_t colon = z.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("");
      t.zoom_start_s = std::stod(z.substr(0, colon)) * 1e-3;
      t.zoom_end_s = std::stod(z.substr(colon + 1)) * 1e-3;
    } catch (const std::exception&) {
      throw ConfigError("--timeline-zoom", "expected START:END in ms, e.g. 0:2.5, got '" + z + "'");
    }
    if (!(t.zoom_end_s > t.zoom_start_s) || t.zoom_start_s < 0)
      throw ConfigError("--timeline-zoom", "expected 0 <= START < END (ms), got '" + z + "'");
  }
  if (a.has("--timeline-ranks")) t.ranks = rank_list(a.get("--timeline-ranks"));
  return t;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& argv) {
  Args a(argv,
         {"--config", "--world", "--set", "--out", "--timeline", "--timeline-zoom", "--timeline-ranks",
          "--hardware", "--flops", "--bw-intra", "--bw-inter", "--alpha-intra", "--alpha-inter", "--launch",
          "--ranks-per-node", "--memory-gib"},
         {"--json", "--per-rank", "--compare-megatron", "--help"});
  if (a.flag("--help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  core::JobSpec spec = core::load_job_spec(a.required("--config"), a.all("--set"));
  int64_t world = a.get_int("--world", -1);
  if (!a.has("--world") || world < 1) throw ConfigError("--world", "give the number of ranks, e.g. --world 8");

  for (const char* t : {"--timeline-zoom", "--timeline-ranks"})
    if (a.has(t) && !a.has("--timeline")) throw ConfigError(t, "draws nothing without --timeline OUT.svg");
  const planner::TimelineOptions timeline_opt = timeline_options(a);

  planner::PlanOptions opt;
  std::string model_used;
  opt.cost = planner::choose_cost_model(a.get_or("--hardware", ""), spec.train.dtype, &model_used);
  planner::CostModel& cm = opt.cost;
  cm.flops = number(a, "--flops", cm.flops);
  if (a.has("--flops")) cm.flops_by_size.clear();  // one rate for every op, as asked
  cm.bw_intra = number(a, "--bw-intra", cm.bw_intra);
  cm.bw_inter = number(a, "--bw-inter", cm.bw_inter);
  cm.alpha_intra = number(a, "--alpha-intra", cm.alpha_intra);
  cm.alpha_inter = number(a, "--alpha-inter", cm.alpha_inter);
  cm.launch = number(a, "--launch", cm.launch);
  cm.ranks_per_node = int(number(a, "--ranks-per-node", cm.ranks_per_node));
  cm.device_memory = int64_t(number(a, "--memory-gib", double(cm.device_memory) / double(1 << 30)) * double(1 << 30));
  std::string overridden;
  for (const char* f : {"--flops", "--bw-intra", "--bw-inter", "--alpha-intra", "--alpha-inter", "--launch",
                        "--ranks-per-node", "--memory-gib"})
    if (a.has(f)) overridden += std::string(overridden.empty() ? "" : ", ") + f;
  if (!overridden.empty()) model_used += "; set by flags: " + overridden;
  opt.simulate = false;

  if (planner::needs_search(spec) || a.flag("--compare-megatron")) {
    planner::SearchOptions so;
    so.cost = cm;
    planner::SearchResult sr = planner::search_plan(spec, int(world), so);
    if (!a.flag("--json")) std::fputs(planner::search_table(sr, int(world)).c_str(), stdout);
    if (a.flag("--compare-megatron")) {
      std::fputs(planner::compare_table(sr.top[0], planner::megatron_baseline(spec, int(world), so)).c_str(),
                 stdout);
      return 0;
    }
    spec = planner::apply_layout(spec, sr.top[0].layout);
  }

  auto t0 = std::chrono::steady_clock::now();
  core::ModelGraph mg = planner::build_planning_graph(spec);
  planner::Plan plan = planner::make_plan(spec, mg.graph, int(world), opt);
  double t_plan = seconds_since(t0);

  auto t1 = std::chrono::steady_clock::now();
  planner::ValidationReport v = planner::validate_plan(plan, mg.graph);
  double t_validate = seconds_since(t1);
  if (!v.ok) {
    std::string msg = "the plan fails validation:";
    for (const std::string& e : v.errors) msg += "\n  " + e;
    throw InternalError(msg);
  }

  auto t2 = std::chrono::steady_clock::now();
  std::vector<std::vector<planner::Span>> timeline;
  plan.costs = planner::simulate_plan(plan, mg.graph, cm, a.has("--timeline") ? &timeline : nullptr);
  plan.costs.planning_s = t_plan;
  double t_sim = seconds_since(t2);

  if (a.has("--out")) planner::write_plan_file(plan, a.get("--out"));
  if (a.has("--timeline")) {
    const std::string svg = planner::timeline_svg(plan, timeline, timeline_opt);  // may refuse the ranks
    std::ofstream f(a.get("--timeline"));
    if (!f) throw IoError("cannot write " + a.get("--timeline"));
    f << svg;
  }
  size_t instrs = 0;
  for (const planner::Role& r : plan.roles) instrs += r.program.size();
  if (a.flag("--json")) {
    std::fputs(planner::plan_to_json(plan).c_str(), stdout);
    std::fputc('\n', stdout);
    std::fprintf(stderr, "cost model: %s\n", model_used.c_str());
  } else {
    std::printf("cost model: %s\n", model_used.c_str());
    planner::ReportOptions ro;
    ro.per_rank = a.flag("--per-rank");
    std::fputs(planner::plan_report(plan, mg.graph, ro).c_str(), stdout);
    std::printf("planned in %.3f s (%zu roles, %zu instructions), validated in %.3f s, simulated in %.3f s\n",
                t_plan, plan.roles.size(), instrs, t_validate, t_sim);
  }
  int64_t peak = 0;
  int worst = 0;
  for (size_t r = 0; r < plan.costs.ranks.size(); ++r)
    if (plan.costs.ranks[r].peak_bytes > peak) peak = plan.costs.ranks[r].peak_bytes, worst = int(r);
  // The process ends when this returns (only main calls it), and the OS takes the plan's
  // memory back at once: freeing its millions of small blocks one by one took 0.7 s CPU
  // for 1.3M instructions (a 7B-like model at 512 ranks). Clang's -disable-free, likewise.
  new planner::Plan(std::move(plan));
  if (peak > cm.device_memory) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "rank %d needs %.2f GiB, over the %.2f GiB budget; try recompute: full, zero: 3, a larger tp "
                  "or pp, or a smaller micro_batch",
                  worst, double(peak) / double(1 << 30), double(cm.device_memory) / double(1 << 30));
    throw ConfigError("parallel", msg);
  }
  return 0;
}

}  // namespace weft::launch
