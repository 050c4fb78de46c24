// Sub-communicators from the plan's group families.
#include "parallel/process_groups.h"

#include <algorithm>

#include "base/check.h"

namespace weft::parallel {

ProcessGroups::ProcessGroups(comm::Communicator& world, const planner::Plan& plan) {
  const int me = world.rank();
  WEFT_CHECK(world.size() == plan.world(), "the plan is for ", plan.world(),
             " ranks, the world has ", world.size());
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
    std::unique_ptr<comm::Communicator> c = world.split(color, key);
    if (color != comm::kNoColor) {
      WEFT_CHECK(c && c->rank() == key, "split gave rank ", c ? c->rank() : -1, " for member ", key,
                 " of group ", color);
      groups_[color] = std::move(c);
    }
  }
}

comm::Communicator& ProcessGroups::group(int id) const {
  auto it = groups_.find(id);
  WEFT_CHECK(it != groups_.end(), "this rank is not in process group ", id);
  return *it->second;
}

void ProcessGroups::abort_all(const std::string& reason) noexcept {
  for (auto& [id, c] : groups_) c->abort(reason);
}

}  // namespace weft::parallel
