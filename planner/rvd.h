// Phase 3's search: converting a value's layout over an ordered device group into the
// layout its consumers need. A layout is the piece each member holds; in RVD terms it is
// R replicas x V addends x D_k chunks per dim, where V carries the operator its addends
// combine under: V-sum (partial sums) or V-max (partial maxima, a vocabulary-parallel row
// max). A shortest-path search over layouts (alpha-beta cost; A*, its bound in
// planner/rvd_bound.h) uses the primitive moves, each a real collective within sub-groups of
// the members:
//   V -> R  all_reduce (sum or max, as V says)    V-sum -> D_k  reduce_scatter
//   D_k -> R  all_gather    D_i -> D_j  all_to_all    R -> D_k  local chunk (no communication)
// and ends where every member can cut its needed piece out of what it holds. A V-max value
// is never summed: its addends only meet in a max all-reduce (the executor reduce-scatters
// by sum only).
//
// A ragged dim is one whose extents are known only at run time (MoE routing: how many of a
// lane's routed rows go to each expert). Its static boxes are the sizes under uniform
// routing, and it has one move, all_to_all_v, which regroups the dim within a team: each
// member's chunk is cut into one block per member and block u of every member goes to
// member u (D over the source rows -> D over the destination: the expert dispatch; and
// back: the return). Rows grouped by destination in source-major order are the strided
// slices {start u q, size q, count f, stride f q}; the source chunks are plain ranges. A
// ragged value is never gathered, chunked, reduced or cut locally: its blocks' sizes differ
// per step.
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/box.h"
#include "planner/cost.h"

namespace weft::planner {

using GroupLayout = std::vector<Piece>;  // member -> its piece

// R, V and the D factor of each dim, when the layout is uniform over `whole`.
struct Rvd {
  int64_t r = 1, v = 1;
  ReduceOp reduce = ReduceOp::kSum;  // how the V addends combine (kSum when v == 1)
  std::vector<int64_t> d;
  std::string str() const;  // "R2 V1 D(1,1,4)"; a V-max: "R1 V2max D(1,1)"
};
std::optional<Rvd> rvd_of(const GroupLayout& layout, const Box& whole);

enum class MoveKind : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kAllToAllV,
  kChunk
};
const char* move_name(MoveKind k);

struct Move {
  MoveKind kind = MoveKind::kChunk;
  int dim = -1, dim2 = -1;  // gather/scatter dim; all_to_all: dim split away (dim) and into (dim2);
                            // all_to_all_v: the ragged dim (dim2 -1)
  int64_t groups = 1;       // strided groups along the split dim
  int factor = 1;           // members per collective
  // Every collective's members, in group order = the order of their chunks along the dim.
  std::vector<std::vector<int>> teams;
  GroupLayout after;
  double cost = 0;
  ReduceOp reduce = ReduceOp::kSum;  // all_reduce: the operator of the addends it combines
};

struct RvdPath {
  std::vector<Move> moves;
  double cost = 0;  // including the final local cuts
  int layouts = 0;  // layouts the search expanded to find it (kept with it in an RvdCache)
};

// A planner's memo of layout searches: the paths found, keyed by the layouts relative to
// the slice they cover, the element size, whether the group crosses nodes, every field of
// the cost model and the one term the plan's world sets in the prices (launch_oversub's
// weight, so plans of several worlds share entries where it agrees). Owned by whoever plans
// (make_plan makes one per plan unless PlanOptions::layout_cache names one; a PlanCache
// keeps one for all its worlds); nothing is process-wide, so two planners never see each
// other's entries. Thread-safe: a PlanCache plans ahead on a background thread while its
// caller plans.
class RvdCache {
 public:
  RvdCache() = default;
  RvdCache(const RvdCache&) = delete;
  RvdCache& operator=(const RvdCache&) = delete;

  // Paths kept (tests).
  size_t size() const;
  // The path stored under `key`, if any.
  std::optional<RvdPath> find(const std::string& key) const;
  // Keeps `path` under `key` (the first one stored for a key stays).
  void insert(const std::string& key, const RvdPath& path);

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, RvdPath> paths_;
};

// The cheapest moves from `from` to a layout from which every member i with need[i] can cut
// need[i] locally (the caller emits those cuts). Boxes are global coordinates inside
// `whole`. With a `cache`, results are looked up and kept there (see RvdCache); without
// one, the search runs every time. Throws NotSupported when no path exists ("no layout
// conversion exists": every layout the moves reach was tried) or when the search gives up
// at its bound of 4000 layouts ("gave up after ...": a longer path may exist); failures
// are not cached.
//
// `blocks` > 1: the members are that many data-parallel replicas of one device list,
// block-major (member b * size / blocks + p). A team is then kept only where a group family
// can name it (planner/plan.h): inside one replica, or the same devices of every replica in
// replica-major order. This is how phase 3 derives the collectives that span data-parallel
// replicas (gradient reduction, ZeRO's scatters and gathers) with the same search.
//
// `ragged_dim` >= 0: that dim is ragged (see above); the path is then made of all_to_all_v
// moves only and ends where every member holds exactly its need.
//
// `world`: the plan's ranks. A move is priced as the simulator prices what it becomes at
// that world, but for processor sharing: on an oversubscribed CPU host each collective pays
// launch_oversub, so a split that saves message steps for more launches is chosen only where
// it is cheaper there; bytes are priced at one rank per core (the sharing the simulator
// applies is a fixed point of the finished plan; see Search::collective in rvd.cc). 0:
// unknown (no launch_oversub).
RvdPath rvd_search(const GroupLayout& from, const std::vector<std::optional<Piece>>& need,
                   const Box& whole, int64_t elem_bytes, const CostModel& cost, bool cross_node,
                   RvdCache* cache = nullptr, int blocks = 1, int ragged_dim = -1, int world = 0);

CollKind move_collective(MoveKind k);

}  // namespace weft::planner
