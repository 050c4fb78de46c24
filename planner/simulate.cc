// Simulation: the engine with timing, summarised.
#include "planner/simulate.h"

#include <algorithm>
#include <cmath>

#include "planner/step_end.h"

namespace weft::planner {
namespace {

double instr_time(const Plan& plan, const Role& role, const Instr& in, const OpWork& w,
                  const CostModel& cost) {
  const int self = plan.mesh.rank_of(role.stage, role.lane, 0);
  switch (in.kind) {
    case InstrKind::kCompute:
      return cost.compute(w, plan.world());
    case InstrKind::kLocal:
      return cost.local_copy(role.tensors[size_t(in.out[0].tensor)].bytes, plan.world());
    case InstrKind::kCollective: {
      const ProcessGroup& grp = plan.groups.at(size_t(plan.group_id(in.group, 0)));
      bool cross = false;
      for (int r : grp.ranks) cross = cross || r / cost.ranks_per_node != grp.ranks[0] / cost.ranks_per_node;
      return cost.collective(in.coll, int(grp.ranks.size()), in.bytes, cross, plan.world());
    }
    case InstrKind::kRecv: {
      int peer = plan.peer_rank(self, in.peer);
      return cost.p2p(in.bytes, peer / cost.ranks_per_node != self / cost.ranks_per_node,
                      plan.world());
    }
    default: return 0;
  }
}

}  // namespace

double pipeline_estimate(const Plan& plan, const PlanWork& work, const CostModel& cost,
                         std::vector<double>* stage_s) {
  const int pp = int(plan.mesh.degrees().pp), lanes = plan.mesh.lanes();
  std::vector<double> stage(size_t(pp), 0);
  double step = 0;
  for (int s = 0; s < pp; ++s)
    for (int l = 0; l < lanes; ++l) {
      const Role& role = plan.roles[size_t(s * lanes + l)];
      double unit = 0, opt = 0;
      const std::vector<OpWork>& w = work[size_t(s * lanes + l)];
      for (size_t i = 0; i < role.program.size(); ++i) {
        const Instr& in = role.program[i];
        double t = instr_time(plan, role, in, w[i], cost);
        // Gradient synchronisation happens once per step, whichever unit it sits in.
        if (in.stage == Stage::kStep || in.part.rfind("grad.", 0) == 0) opt += t;
        else if (in.mb == 0) unit += t;
      }
      stage[size_t(s)] = std::max(stage[size_t(s)], unit);
      step = std::max(step, opt);
    }
  double sum = 0, slowest = 0;
  for (double t : stage) sum += t, slowest = std::max(slowest, t);
  if (stage_s) *stage_s = stage;
  return sum + double(plan.config.micro_batches - 1) * slowest + step;
}

CostAnnotations simulate_plan(const Plan& plan, const core::Graph& g, const CostModel& cost,
                              std::vector<std::vector<Span>>* timeline) {
  EngineOptions opt;
  CostModel shared = cost;
  opt.cost = &shared;
  opt.timeline = timeline != nullptr;
  // Replica 0 stands for every data-parallel replica (validate_plan checks them all): at
  // 512 ranks of dp 8 the simulation runs an eighth of the programs.
  opt.one_replica = true;
  const PlanWork work = plan_work(plan, g);  // once, for every run below and the estimate
  opt.work = &work;
  const PlanDurations alone = durations_alone(plan, work, cost);  // active_ranks changes below
  opt.alone = &alone;
  EngineSchedule schedule;  // the first run's matching, re-timed by every iteration below
  opt.record = &schedule;
  EngineResult r = run_programs(plan, g, opt);
  opt.record = nullptr;
  // Processor sharing, mean-field: with more ranks than cores on a node, compute slows by
  // (ranks runnable at once) / cores, and the oversubscribed wait of a collective follows
  // the same count (CostModel::active_ranks, runnable_weight). A rank is runnable while it
  // computes or sits in a collective (the oversubscribed probe's ranks, every one looping
  // between the two, paid a time slice a call), not while it waits for a pipeline message
  // or has finished its step: a pipeline whose stages wait in turn leaves cores free. How
  // many are runnable depends on the times they give, so iterate to the fixed point, damped.
  const int on_node = cost.ranks_on_node(plan.world());
  if (cost.cores > 0 && cost.active_ranks <= 0 && on_node > cost.cores && r.errors.empty()) {
    const double nodes = std::ceil(double(plan.world()) / double(on_node));
    double active = on_node;
    const EngineResult checked = r;
    for (int it = 0; it < 12; ++it) {
      double step = 0, runnable = 0;
      for (const RankCost& rc : r.ranks) step = std::max(step, rc.step_s);
      for (const RankCost& rc : r.ranks)
        runnable += step > 0 ? std::max(0.0, rc.step_s - rc.recv_wait_s) / step : 0;
      const double next = std::clamp(runnable / nodes, 1.0, double(on_node));
      if (std::fabs(next - active) < 1e-3 * active) break;
      active = 0.5 * (active + next);
      shared.active_ranks = active;
      r = retime(plan, g, schedule, checked, opt);
    }
  }
  // The trainer's statistics exchange before the optimizer (step_end.h), as the stage model
  // charges it: after the largest role's optimizer compute, added to every rank's step (the
  // exchange spans the world, so the ranks leave it together; their optimizers differ little).
  double optimizer = 0;
  for (size_t ri = 0; ri < plan.roles.size(); ++ri) {
    double t = 0;
    const Role& role = plan.roles[ri];
    for (size_t i = 0; i < role.program.size(); ++i)
      if (role.program[i].kind == InstrKind::kCompute && g.op(role.program[i].op).type == "adamw")
        t += shared.compute(work[ri][i], plan.world());
    optimizer = std::max(optimizer, t);
  }
  const double exchange =
      trainer_exchange_s(cost, plan.world(), optimizer, plan.world() > cost.ranks_per_node);
  for (RankCost& rc : r.ranks) {
    rc.step_s += exchange;
    rc.comm_s += exchange;
  }
  CostAnnotations c;
  c.exchange_s = exchange;
  c.valid = r.errors.empty();
  c.model = cost;
  c.ranks = std::move(r.ranks);
  double bubble = 0;
  for (const RankCost& rc : c.ranks) {
    c.step_s = std::max(c.step_s, rc.step_s);
    bubble += rc.bubble;
  }
  c.bubble = c.ranks.empty() ? 0 : bubble / double(c.ranks.size());
  c.pipeline_estimate_s = pipeline_estimate(plan, work, cost, &c.stage_s);
  if (timeline) *timeline = std::move(r.timeline);
  return c;
}

}  // namespace weft::planner
