// The ranks behind finish their step with the records of a rank ahead (roll_forward.h).
#include "launch/roll_forward.h"

#include <algorithm>

#include "base/check.h"

namespace weft::launch {

RollForward roll_forward(planner::PlanCache& plans, const parallel::StateSpace& space,
                         std::vector<HolderReport>& reports, int world_size,
                         comm::Communicator& world, const HeldState& held) {
  RollForward roll;
  const int n = std::min<int>(world_size, int(reports.size()));
  // The latest step some live rank can finish, and the epoch it was trained in.
  int64_t step = -1, epoch = -1;
  for (int q = 0; q < n; ++q) {
    const HolderReport& r = reports[size_t(q)];
    if (r.valid && r.unfinished >= 0 && r.unfinished == r.step &&
        std::make_pair(r.step, r.epoch) > std::make_pair(step, epoch))
      step = r.step, epoch = r.epoch;
  }
  if (step < 0) return roll;
  int source = -1;
  for (int q = 0; q < n && source < 0; ++q) {
    const HolderReport& r = reports[size_t(q)];
    if (r.valid && r.epoch == epoch && r.step == step + 1 && r.records_step == step) source = q;
  }
  if (source < 0) return roll;  // nobody got through the exchange: everybody redoes the step
  std::vector<HolderReport> rolled = reports;
  std::vector<int> behind;
  for (int q = 0; q < n; ++q) {
    HolderReport& r = rolled[size_t(q)];
    if (r.valid && r.epoch == epoch && r.unfinished == step && r.step == step) {
      r.step = step + 1;
      r.unfinished = -1;
      behind.push_back(q);
    }
  }
  const Holders h = choose_holders(plans, space, rolled, world_size);
  if (!h.found || h.step != step + 1 || h.epoch != epoch) return roll;
  reports = std::move(rolled);
  roll.step = step;
  roll.ranks = behind;
  roll.source = source;
  roll.mine = std::find(behind.begin(), behind.end(), world.rank()) != behind.end();
  // The source's records, to every rank (a broadcast is collective).
  const bool from_me = world.rank() == source;
  WEFT_CHECK(!from_me || held.records_step == step, "rank ", source,
             " reported the records of step ", step, " but holds those of step ",
             held.records_step);
  core::Tensor len = core::Tensor::from_vector<int64_t>(
      {1}, {from_me ? int64_t(held.records.size()) : int64_t(0)});
  comm::BroadcastOptions o;
  o.root = source;
  world.broadcast(len, o).wait();
  const int64_t count = len.data<int64_t>()[0];
  core::Tensor values = core::Tensor::empty({std::max<int64_t>(1, count)}, core::DType::kF64);
  if (from_me) std::copy(held.records.begin(), held.records.end(), values.data<double>());
  if (count > 0) world.broadcast(values.slice(0, 0, count), o).wait();
  if (roll.mine) roll.records.assign(values.data<double>(), values.data<double>() + count);
  return roll;
}

}  // namespace weft::launch
