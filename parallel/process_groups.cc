// Sub-communicators from the plan's group families.
#include "parallel/process_groups.h"

#include <algorithm>

#include "base/check.h"
#include "comm/registry.h"

namespace weft::parallel {

namespace {

// Every group of family `f` has exactly one rank.
bool singletons(const planner::Plan& plan, int f) {
  for (const planner::ProcessGroup& g : plan.groups)
    if (g.family == f && g.ranks.size() != 1) return false;
  return true;
}

// Family `f` is one group of every rank of the world, in rank order.
bool whole_world(const planner::Plan& plan, int f, int world) {
  int groups = 0;
  for (const planner::ProcessGroup& g : plan.groups) {
    if (g.family != f) continue;
    if (++groups > 1 || int(g.ranks.size()) != world) return false;
    for (int r = 0; r < world; ++r)
      if (g.ranks[size_t(r)] != r) return false;
  }
  return groups == 1;
}

}  // namespace

ProcessGroups::ProcessGroups(comm::Communicator& world, const planner::Plan& plan)
    : world_(&world), built_for_(plan.groups), programs_(plan.roles.size()) {
  const int me = world.rank();
  WEFT_CHECK(world.size() == plan.world(), "the plan is for ", plan.world(),
             " ranks, the world has ", world.size());
  const bool one_program = plan.roles.size() == 1;
  const bool host = world.backend() != comm::BackendKind::kNccl;
  // A rank is in at most one group of each family (one group per dp index, or one for all).
  for (size_t f = 0; f < plan.families.size(); ++f) {
    int color = comm::kNoColor, key = 0;
    for (const planner::ProcessGroup& g : plan.groups) {
      if (g.family != int(f)) continue;
      auto it = std::find(g.ranks.begin(), g.ranks.end(), me);
      if (it == g.ranks.end()) continue;
      WEFT_CHECK(color == comm::kNoColor, "rank ", me, " is in two groups of family ", f);
      color = g.id;
      key = int(it - g.ranks.begin());
    }
    if (one_program && whole_world(plan, int(f), world.size())) {
      groups_[color] = &world;
      ++world_groups_;
      continue;
    }
    if (host && singletons(plan, int(f))) {
      if (color == comm::kNoColor) continue;
      comm::CommOptions o;
      o.rank = 0;
      o.size = 1;
      o.timeout = world.timeout();
      owned_.push_back(comm::make_communicator(comm::BackendKind::kLoopback, o));
      groups_[color] = owned_.back().get();
      continue;
    }
    std::unique_ptr<comm::Communicator> c = world.split(color, key);
    ++splits_;
    if (color != comm::kNoColor) {
      WEFT_CHECK(c && c->rank() == key, "split gave rank ", c ? c->rank() : -1, " for member ", key,
                 " of group ", color);
      owned_.push_back(std::move(c));
      groups_[color] = owned_.back().get();
    }
  }
}

bool ProcessGroups::fits(const comm::Communicator& world, const planner::Plan& plan) const {
  if (&world != world_ || plan.roles.size() != programs_ || plan.groups.size() != built_for_.size())
    return false;
  for (size_t i = 0; i < built_for_.size(); ++i) {
    const planner::ProcessGroup &a = built_for_[i], &b = plan.groups[i];
    if (a.id != b.id || a.family != b.family || a.ranks != b.ranks) return false;
  }
  return true;
}

comm::Communicator& ProcessGroups::group(int id) const {
  auto it = groups_.find(id);
  WEFT_CHECK(it != groups_.end(), "this rank is not in process group ", id);
  return *it->second;
}

void ProcessGroups::abort_all(const std::string& reason) noexcept {
  for (auto& [id, c] : groups_) c->abort(reason);
}

std::vector<comm::Communicator*> ProcessGroups::communicators() const {
  std::vector<comm::Communicator*> out;
  for (const auto& [id, c] : groups_)
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

}  // namespace weft::parallel
