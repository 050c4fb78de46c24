// Re-timing a recorded engine run under another cost model: the simulator's processor-sharing
// iterations (simulate.cc) price one schedule many times; matching and checking it once is enough.
#include <algorithm>

#include "base/check.h"
#include "planner/engine.h"

namespace weft::planner {

EngineResult retime(const Plan& plan, const core::Graph& g, const EngineSchedule& schedule,
                    const EngineResult& checked, const EngineOptions& opt) {
  WEFT_CHECK(opt.cost != nullptr, "retime needs a cost model");
  WEFT_CHECK(checked.errors.empty(), "retime needs an error-free run");
  const CostModel& cost = *opt.cost;
  const int world = plan.world();
  auto active = [&](int r) { return !opt.one_replica || plan.mesh.coord(r).dp == 0; };

  PlanDurations own_alone;
  if (!opt.alone && opt.work) own_alone = durations_alone(plan, *opt.work, cost);
  if (!opt.alone && !opt.work) own_alone = durations_alone(plan, plan_work(plan, g), cost);
  const PlanDurations& alone = opt.alone ? *opt.alone : own_alone;
  const double sharing = cost.sharing(world);
  const int rpn = cost.ranks_per_node;
  std::vector<char> cross(plan.groups.size(), 0);
  for (const ProcessGroup& gr : plan.groups)
    for (int r : gr.ranks) cross[size_t(gr.id)] |= r / rpn != gr.ranks[0] / rpn;

  // Every price class's collective time (EngineSchedule::coll_class).
  std::vector<double> class_s(schedule.class_instr.size());
  for (size_t k = 0; k < class_s.size(); ++k) {
    const int gid = schedule.class_group[k];
    class_s[k] = collective_seconds(plan, g, cost, *schedule.class_instr[k],
                                    int(plan.groups[size_t(gid)].ranks.size()), cross[size_t(gid)]);
  }

  // The engine's per-rank state that times depend on; the checked run gave the rest.
  struct Rank {
    const Role* role = nullptr;
    const std::vector<double>* alone = nullptr;
    const uint8_t* codes = nullptr;  // schedule.codes of the role
    size_t pc = 0;
    double clock = 0, busy = 0, fb_end = 0;
    double burst = 0;  // compute since the rank's last collective or receive (CostModel::sync_wait)
    double drift_var = 0, drift_paid = 0;  // the replica's drift (CostModel::replica_drift)
  };
  EngineResult res;
  res.ranks = checked.ranks;
  if (opt.timeline) res.timeline.resize(size_t(world));
  std::vector<Rank> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Rank& R = ranks[size_t(r)];
    const int k = plan.role_index(r);
    R.role = &plan.roles[size_t(k)];
    R.alone = &alone[size_t(k)];
    R.codes = schedule.codes.at(size_t(k)).data();
    RankCost& c = res.ranks[size_t(r)];
    c.step_s = c.compute_s = c.comm_s = c.wait_s = c.recv_wait_s = c.bubble = 0;
  }
  // As the engine's retire(): the span, then the busy time and end of forward/backward work.
  // The instruction is read only for a timeline's span.
  auto retire = [&](int r, double start, double busy) {
    Rank& R = ranks[size_t(r)];
    if (opt.timeline && R.clock > start) {
      const Instr& in = R.role->program[R.pc];
      res.timeline[size_t(r)].push_back(
          {start, R.clock, in.kind, in.stage, in.mb, in.chunk, in.recompute, int32_t(R.pc)});
    }
    if (!(R.codes[R.pc] & EngineSchedule::kStepWork)) {
      R.busy += busy;
      R.fb_end = std::max(R.fb_end, R.clock);
    }
    ++R.pc;
  };

  std::vector<double> sent;  // per send, in send order: the sender's clock
  std::vector<double> sent_burst;  // ... and its compute since its last synchronisation
  std::vector<std::pair<double, double>> sent_drift;  // ... and its drift (variance, paid)
  const std::vector<int> replicas = replicas_per_group(plan);
  size_t recvs = 0;
  for (const EngineSchedule::Step& step : schedule.steps) {
    if (step.rank < 0) {
      const size_t k = size_t(-1 - step.rank);
      const int first = schedule.coll_begin[k];
      const int last = k + 1 < schedule.coll_begin.size() ? schedule.coll_begin[k + 1]
                                                          : int(schedule.coll_ranks.size());
      double ready = 0, burst = 0, drift_var = 0, drift_paid = 0;
      for (int m = first; m < last; ++m) {
        const Rank& M = ranks[size_t(schedule.coll_ranks[size_t(m)])];
        ready = std::max(ready, M.clock);
        burst = std::max(burst, M.burst);
        drift_var = std::max(drift_var, M.drift_var);
        drift_paid = std::max(drift_paid, M.drift_paid);
      }
      const int cls = schedule.coll_class[k];
      const int gid = schedule.class_group[size_t(cls)];
      const int members = int(plan.groups[size_t(gid)].ranks.size());
      const double w = cost.sync_wait(burst, members, world);
      double d = class_s[size_t(cls)] + w;
      if (replicas[size_t(gid)] > 1) {  // as the engine
        const double due = cost.replica_drift(drift_var, replicas[size_t(gid)]);
        if (due > drift_paid) d += due - drift_paid, drift_paid = due;
      } else {
        drift_var += cost.wait_variance(w, members);
      }
      const double end = ready + d;
      for (int m = first; m < last; ++m) {
        const int q = schedule.coll_ranks[size_t(m)];
        Rank& Q = ranks[size_t(q)];
        const double start = Q.clock;
        Q.clock = end;
        Q.burst = 0;
        Q.drift_var = drift_var, Q.drift_paid = drift_paid;
        RankCost& c = res.ranks[size_t(q)];
        c.comm_s += d;
        c.wait_s += end - start - d;
        retire(q, start, d);
      }
      continue;
    }
    const int r = step.rank;
    Rank& R = ranks[size_t(r)];
    RankCost& c = res.ranks[size_t(r)];
    while (R.pc < step.end_pc) {
      const double start = R.clock;
      switch (InstrKind(R.codes[R.pc] & ~EngineSchedule::kStepWork)) {
        case InstrKind::kLoad:
        case InstrKind::kCompute:
        case InstrKind::kLocal: {
          const double d = (*R.alone)[R.pc] * sharing;
          R.clock += d;
          R.burst += d;
          c.compute_s += d;
          retire(r, start, d);
          break;
        }
        case InstrKind::kFree:
          ++R.pc;
          break;
        case InstrKind::kSend: {
          sent.push_back(R.clock);
          sent_burst.push_back(R.burst);
          sent_drift.push_back({R.drift_var, R.drift_paid});
          const Instr& in = R.role->program[R.pc];
          const int peer = plan.peer_rank(r, in.peer);
          const double d = cost.send_s(in.bytes, r / rpn != peer / rpn, world);  // as the engine
          R.clock += d;
          c.comm_s += d;
          retire(r, start, 0);
          break;
        }
        case InstrKind::kRecv: {
          const int peer = schedule.recv_peer[recvs];
          const int64_t bytes = schedule.recv_bytes[recvs];
          const size_t send = size_t(schedule.recv_send.at(recvs++));
          const double t = sent.at(send);
          const double w = cost.message_wait(std::max(sent_burst[send], R.burst), world);
          const double transfer = cost.p2p(bytes, r / rpn != peer / rpn, world) + w;
          R.drift_var = std::max(R.drift_var, sent_drift[send].first) +
                        cost.wait_variance(w, 2);  // as the engine
          R.drift_paid = std::max(R.drift_paid, sent_drift[send].second);
          R.clock = std::max(R.clock, t + transfer);
          R.burst = 0;
          const double moving = std::min(transfer, R.clock - start);
          c.comm_s += moving;
          c.wait_s += R.clock - start - moving;
          c.recv_wait_s += R.clock - start - moving;
          retire(r, start, 0);
          break;
        }
        case InstrKind::kCollective:
          WEFT_CHECK(false, "a schedule's run step holds a collective");
      }
    }
  }

  // As the engine's finish(): step times, then replica 0's results for its twins, then bubbles.
  for (int r = 0; r < world; ++r) {
    if (!active(r)) continue;
    res.ranks[size_t(r)].step_s = ranks[size_t(r)].clock;
    res.fb_end = std::max(res.fb_end, ranks[size_t(r)].fb_end);
  }
  auto twin = [&](int r) {
    const Role& role = *ranks[size_t(r)].role;
    return plan.mesh.rank_of(role.stage, role.lane, 0);
  };
  for (int r = 0; r < world; ++r) {
    if (active(r)) continue;
    res.ranks[size_t(r)] = res.ranks[size_t(twin(r))];
    if (opt.timeline) res.timeline[size_t(r)] = res.timeline[size_t(twin(r))];
  }
  for (int r = 0; r < world; ++r) {
    const double busy = ranks[size_t(active(r) ? r : twin(r))].busy;
    res.ranks[size_t(r)].bubble = res.fb_end > 0 ? std::max(0.0, 1.0 - busy / res.fb_end) : 0;
  }
  return res;
}

}  // namespace weft::planner
