// `weft bench scaling --attribute ROW`: where one layout's step goes, instruction by
// instruction, against the simulator's price of each. The row trains under the executor's
// per-instruction timing ($WEFT_INSTR_TIMES, parallel/executor.h); the plan is made again
// here the way `weft train` made it, priced under the cost model given, and both sides are
// summed by instruction group (a compute op's type, a collective's kind and part,
// receives, copies) so that a group the model does not price at all, or prices at a
// fraction, stands out.
#include "launch/bench_attribute.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/config/job_spec.h"
#include "launch/bench_util.h"
#include "launch/job_cost_model.h"
#include "planner/engine.h"
#include "planner/planner.h"
#include "planner/simulate.h"

namespace weft::launch {
namespace {

struct Group {
  // simulated_s: the simulator's time on the rank from the instruction's start to its end,
  // as the executor times it (a collective's wait for its last member and the wait curves
  // in it), where predicted_s prices the instruction alone.
  double measured_s = 0, settle_s = 0, predicted_s = 0, simulated_s = 0;
  int count = 0;
};

// The group an instruction's time is summed under.
std::string group_of(const planner::Instr& in, const core::Graph& g) {
  using planner::InstrKind;
  switch (in.kind) {
    case InstrKind::kCompute:
      return "compute " + g.op(in.op).type + (in.recompute ? " (recompute)" : "");
    case InstrKind::kLocal: return "local copy";
    case InstrKind::kCollective:
      return std::string("collective ") + planner::coll_name(in.coll) + " " + in.part;
    case InstrKind::kSend: return "send";
    case InstrKind::kRecv: return "recv";
    case InstrKind::kLoad: return "load";
    case InstrKind::kFree: return "free";
  }
  return "?";
}

// Per program position: {seconds, settle seconds}; the step end's seconds in `tail`.
std::vector<std::pair<double, double>> read_times(const std::string& file, double* tail, double* update,
                                                 int* steps) {
  std::ifstream f(file);
  std::vector<std::pair<double, double>> out;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ls(line);
    if (line.rfind("#", 0) == 0) {
      std::string h, t;
      ls >> h >> h >> *steps >> t >> *tail >> t >> *update;
      continue;
    }
    size_t pos;
    double run, settle;
    if (ls >> pos >> run >> settle) {
      if (out.size() <= pos) out.resize(pos + 1);
      out[pos] = {run, settle};
    }
  }
  return out;
}

}  // namespace

int attribute_layout(const std::string& config, const std::vector<std::string>& sets, int world, int steps,
                     const planner::CostModel& cm, int rank) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("weft-attribute-" + std::to_string(::getpid())))
                              .string();
  std::filesystem::create_directories(dir);
  ::setenv("WEFT_INSTR_TIMES", dir.c_str(), 1);
  const LayoutTimes t = run_layout(config, sets, world, steps, "attribute");
  ::unsetenv("WEFT_INSTR_TIMES");
  if (!t.error.empty()) {
    std::filesystem::remove_all(dir);
    std::fprintf(stderr, "the run failed: %s\n", t.error.c_str());
    return 1;
  }
  double tail = 0, update = 0;
  int timed = 0;
  const auto times = read_times(dir + "/instr-" + std::to_string(rank) + ".tsv", &tail, &update, &timed);
  std::filesystem::remove_all(dir);
  if (times.empty()) {
    std::fprintf(stderr, "rank %d wrote no instruction times\n", rank);
    return 1;
  }

  std::vector<std::string> plan_sets = sets;
  for (const std::string& x : short_run_sets(2, "/tmp/weft-attribute-plan")) plan_sets.push_back(x);
  core::JobSpec spec = core::load_job_spec(config, plan_sets);
  // The program the run timed: planned under the job's cost model, as its workers plan
  // (job_cost_model.h; planned under `cm`, dp2 x tp2 had 956 instructions where the run had
  // 792), priced under `cm`.
  core::ModelGraph mg = planner::build_planning_graph(spec);
  planner::Plan plan =
      planner::make_plan(spec, mg.graph, world, job_plan_options(spec.train.dtype));
  std::vector<std::vector<planner::Span>> timeline;
  const planner::CostAnnotations sim = planner::simulate_plan(plan, mg.graph, cm, &timeline);
  const planner::PlanWork work = planner::plan_work(plan, mg.graph);
  const planner::PlanDurations alone = planner::durations_alone(plan, work, cm);
  const planner::RankProgram prog = plan.program(rank);
  const std::vector<double>& dur = alone.at(size_t(prog.role));
  if (times.size() != prog.program.size()) {
    std::fprintf(stderr, "rank %d timed %zu instructions, its plan has %zu: not the same plan\n", rank,
                 times.size(), prog.program.size());
    return 1;
  }
  const double share = cm.sharing(world);
  std::vector<double> simulated(prog.program.size(), 0);
  for (const planner::Span& sp : timeline.at(size_t(rank)))
    if (sp.pc >= 0 && size_t(sp.pc) < simulated.size())
      simulated[size_t(sp.pc)] += sp.end - sp.start;
  std::map<std::string, Group> groups;
  double measured = 0, predicted = 0;
  for (size_t i = 0; i < prog.program.size(); ++i) {
    const planner::Instr& in = prog.program[i];
    Group& gr = groups[group_of(in, mg.graph)];
    double p = dur[i] * share;
    if (in.kind == planner::InstrKind::kCollective) {
      const planner::ProcessGroup& pg = plan.groups.at(size_t(in.group));
      p = planner::collective_seconds(plan, mg.graph, cm, in, int(pg.ranks.size()), false);
    } else if (in.kind == planner::InstrKind::kRecv) {
      p = cm.p2p(in.bytes, false, plan.world());
    } else if (in.kind == planner::InstrKind::kSend) {
      p = cm.send_s(in.bytes, false, plan.world());  // as the engine holds the sender
    }
    gr.measured_s += times[i].first;
    gr.settle_s += times[i].second;
    gr.predicted_s += p;
    gr.simulated_s += simulated[i];
    ++gr.count;
    measured += times[i].first + times[i].second;
    predicted += p;
  }
  const planner::RankCost& rc = sim.ranks.at(size_t(rank));
  std::printf("rank %d of %d, %d timed steps; measured step mean %.3f ms (rank 0 compute %.3f, comm %.3f)\n", rank,
              world, timed, t.mean_ms, t.compute_mean_ms, t.comm_mean_ms);
  std::printf("simulated step %.3f ms: rank %d compute %.3f, comm %.3f, wait %.3f (exchange %.3f)\n",
              sim.step_s * 1e3, rank, rc.compute_s * 1e3, rc.comm_s * 1e3, rc.wait_s * 1e3, sim.exchange_s * 1e3);
  std::printf("%-44s | %5s | %11s | %11s | %12s | %10s | %12s | %10s\n",
              "instruction group (per step)", "count", "measured ms", "of it settle",
              "priced alone", "meas-pred", "simulated ms", "meas-sim");
  for (const auto& [name, gr] : groups)
    std::printf("%-44s | %5d | %11.3f | %11.3f | %12.3f | %+10.3f | %12.3f | %+10.3f\n",
                name.c_str(), gr.count, (gr.measured_s + gr.settle_s) * 1e3, gr.settle_s * 1e3,
                gr.predicted_s * 1e3, (gr.measured_s + gr.settle_s - gr.predicted_s) * 1e3,
                gr.simulated_s * 1e3, (gr.measured_s + gr.settle_s - gr.simulated_s) * 1e3);
  std::printf("%-44s | %5s | %11.3f | %11s | %12s |\n", "step end (buckets and sends completed)", "", tail * 1e3, "",
              "");
  std::printf("%-44s | %5s | %11.3f | %11s | %12.3f | %+10.3f\n", "statistics exchange (before the update)", "",
              update * 1e3, "", sim.exchange_s * 1e3, (update - sim.exchange_s) * 1e3);
  measured += update;
  predicted += sim.exchange_s;
  std::printf("%-44s | %5s | %11.3f | %11s | %12.3f | %+10.3f\n", "sum of the program", "", (measured + tail) * 1e3,
              "", predicted * 1e3, (measured + tail - predicted) * 1e3);
  std::printf("outside the program (the trainer's batch and metrics): %.3f ms measured\n",
              t.mean_ms - (measured + tail) * 1e3);
  return 0;
}

}  // namespace weft::launch
