// A*'s lower bound for the RVD search (planner/rvd.h): what a layout must still pay before
// every member can cut its need. Kept apart from the search so that its argument can be
// read, and checked, on its own.
#pragma once

#include <optional>
#include <vector>

#include "planner/box.h"
#include "planner/cost.h"

namespace weft::planner {

// A lower bound of the cost of any path of moves from `layout` (member -> piece; `blocks`
// data-parallel replicas of one device list, block-major, as rvd_search takes them) to one
// where every member i with need[i] can cut it locally. Consistent: no move lowers it by more
// than the move costs, so the search's first goal popped is still the cheapest path.
//
// Two terms, the larger counts:
// - A member whose piece lacks elements or addends of its need pays at least one collective:
//   a launch and one message step.
// - With blocks > 1, a collective whose team leaves a block has a member in every block (the
//   teams a group family can name), so it costs at least the fixed part of a collective over
//   `blocks` members. A member pays one when its block holds none of some element of its need
//   (no move inside the block brings it in). When its block also lacks addends of its need,
//   only an all-reduce or a reduce-scatter across the blocks can bring them; a reduce-scatter
//   leaves the block at most block_size / blocks of the whole, so a need larger than that pays
//   an all-reduce across the blocks or two collectives across them. This is what keeps a
//   gradient summed over 128 replicas of 4 ep lanes from expanding every cheap layout of the
//   4 lanes before it pays for the sum across the replicas.
// Both are priced at `world` as the search prices its moves (the fixed part of a collective
// there includes launch_oversub where the node is oversubscribed; a collective's byte term
// is never negative, so leaving it out keeps the bound below any path).
double rvd_lower_bound(const std::vector<Piece>& layout,
                       const std::vector<std::optional<Piece>>& need, const Box& whole,
                       const CostModel& cost, bool cross_node, int blocks, int world = 0);

}  // namespace weft::planner
