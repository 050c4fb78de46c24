// The Virtual Parameter Space: every piece of training state that outlives a step has
// global logical coordinates (a StateId and a global shape), and a parallel layout is a map
// from ranks to plain boxes in that space. The one layout function is layout_of(plan, rank):
// it reads Plan::program(rank).tensors, the table the executor allocates from, and never
// re-derives a sharding (DynaTrain's worst bug class: a planner that drifts from reality).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/graph/graph.h"
#include "core/tensor.h"
#include "planner/plan.h"

namespace weft::core {
class MoeBalance;
}

namespace weft::parallel {

using StateId = int;

enum class StateKind : uint8_t {
  kParameter,  // trainable weights (graph role kParameter)
  kAdamM,      // "adam_m:<param>"
  kAdamV,      // "adam_v:<param>"
  kMaster,     // "master:<param>": f32 master weights, present only when they differ
  kScalar,     // step, seed, data cursor: one i64, held by every rank
  kBuffer,     // training state outside the graph, held whole and identical by every rank
               // (loss_free's routing bias "moe.bias:h.<layer>"): stored as tensor data
};
const char* state_kind_name(StateKind k);

struct StateTensor {
  StateId id = -1;
  std::string
      name;  // the graph value's name ("h.0.attn.qkv.weight", "adam_m:wte.weight"), or "step"
  StateKind kind = StateKind::kParameter;
  core::Shape shape;  // global
  core::DType dtype = core::DType::kF32;
  int value = -1;  // graph value id; -1 for scalars and buffers
};

// The scalars every layout carries (StateId order after the tensors). The data cursor is
// the step: data order is a pure function of (seed, step, global sequence index).
inline constexpr const char* kStepState = "step";
inline constexpr const char* kSeedState = "seed";
inline constexpr const char* kDataCursorState = "data.cursor";

// The coordinate system: parameters, optimizer moments and master weights of a training
// graph in value order, then the buffers (training state the graph does not hold: one
// routing bias per MoE block, MoeBalance::bias_name(layer), when `balance` is loss_free),
// then the scalars. Gradients and the global norm are not state: they are zeroed or
// recomputed every step, so nothing needs to move them. Without buffers the StateIds are
// those of a space built without a balance.
class StateSpace {
 public:
  StateSpace() = default;
  static StateSpace from_graph(const core::Graph& g, const core::MoeBalance* balance = nullptr);

  const std::vector<StateTensor>& tensors() const { return tensors_; }
  const StateTensor& at(StateId id) const { return tensors_.at(size_t(id)); }
  int size() const { return int(tensors_.size()); }
  // -1 when absent.
  StateId find(const std::string& name) const;
  StateId of_value(int value) const;

 private:
  std::vector<StateTensor> tensors_;
  std::map<std::string, StateId> by_name_;
  std::map<int, StateId> by_value_;
};

// A plain box of one state tensor: [start[d], start[d] + extent[d]) per dim, and where it
// sits in the rank's local tensor (`local`, at `local_start` in the local tensor's dense
// row-major shape). A strided planner box becomes several StateBoxes of one local tensor.
struct StateBox {
  StateId state = -1;
  std::vector<int64_t> start, extent;
  int local = -1;
  std::vector<int64_t> local_start;
  // Replicas: ranks of the same layout holding an identical box, `replicas` in all; this
  // rank's index among them in rank order (checkpoints pick one writer by these).
  int replica = 0, replicas = 1;
  int64_t numel() const;
  bool operator==(const StateBox& o) const = default;
};

// One tensor a rank allocates for its state. `plan_tensor` is its index in
// Plan::program(rank).tensors (-1 for the scalars, the buffers and for layouts not built
// from a plan).
struct LocalTensor {
  StateId state = -1;
  core::Shape shape;  // dense local shape
  core::DType dtype = core::DType::kF32;
  int plan_tensor = -1;
  int64_t bytes() const { return core::shape_numel(shape) * int64_t(core::dtype_size(dtype)); }
};

struct RankLayout {
  std::vector<LocalTensor> locals;
  std::vector<StateBox> boxes;  // grouped by local tensor, in local order
};

// A layout of the whole state over `ranks.size()` ranks. Rank ids are those of the
// communicator a transition runs over; hosts[r] groups ranks by machine (empty: one host
// per rank).
struct Layout {
  std::vector<RankLayout> ranks;
  std::vector<int> hosts;
  int world() const { return int(ranks.size()); }
  int host(int rank) const { return hosts.empty() ? rank : hosts.at(size_t(rank)); }
};

// THE layout function: the persistent, non-alias state tensors of Plan::program(rank)
// (parameters, optimizer moments, master weights; ZeRO shards and strided chunks
// decomposed into plain boxes) plus the buffers and the scalars, whole on every rank. Replica fields are left 0/1; layout_of
// over all ranks fills them. Throws InternalError for a plan tensor that is a partial sum
// or names a value the space lacks (a plan for another graph).
RankLayout layout_of(const StateSpace& space, const planner::Plan& plan, int rank);
Layout layout_of(const StateSpace& space, const planner::Plan& plan, std::vector<int> hosts = {});

// The single-process trainer's layout: every state tensor whole on rank 0, local tensor i
// = state i.
Layout whole_layout(const StateSpace& space);

// Fills replica / replicas of every box by grouping identical (state, start, extent).
void assign_replicas(Layout& layout);

// The plain boxes covering flat elements [begin, end) of a row-major tensor of `shape`
// (a ZeRO flat shard): at most 2 * dims - 1 boxes, in flat order.
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> flat_range_boxes(
    const core::Shape& shape, int64_t begin, int64_t end);

// Plain boxes of a planner box (strided dims expanded), each with its offset in the dense
// local tensor.
struct PlainPart {
  std::vector<int64_t> start, extent, local_start;
};
std::vector<PlainPart> plain_parts(const planner::Box& box);

// Checks that the layout covers every element of every state tensor at least once and that
// every box lies inside its state and its local tensor; throws InternalError naming the gap.
void check_covers(const StateSpace& space, const Layout& layout);

// Part of a rank's layout: its local tensors `keep` (indices into r.locals, ascending), in
// that order, with their boxes renumbered (what a rank still holds of it after a move that
// stopped midway). InternalError for an index outside r.locals or out of order.
RankLayout only_locals(const RankLayout& r, const std::vector<int>& keep);

// "h.0.mlp.fc.weight[0:64, 128:256] @local 3+(0, 0)".
std::string box_str(const StateSpace& space, const StateBox& b);

// Rank ids renamed: rank r of `layout` becomes to[r] in a world of `world` ranks (a live
// resize runs the old and the new layout over one union communicator).
Layout remap_ranks(const Layout& layout, const std::vector<int>& to, int world);

// The live tensor of buffer state `t` (kBuffer): a view of balance->bias_tensor(layer) for
// "moe.bias:h.<layer>". InternalError when `balance` is null, not loss_free, or has no such
// block (a space built for another job).
core::Tensor buffer_tensor(core::MoeBalance* balance, const StateTensor& t);

// Host tensors for a rank's local tensors (zeroed), in `locals` order.
std::vector<core::Tensor> allocate_locals(const RankLayout& r);

}  // namespace weft::parallel
