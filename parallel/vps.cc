// The VPS: state coordinates from the training graph, layouts read off the plan's tensor
// table, and the box arithmetic that turns strided and flat shards into plain boxes.
#include "parallel/vps.h"

#include <algorithm>
#include <sstream>
#include <tuple>

#include "base/check.h"
#include "base/error.h"
#include "core/graph/moe_balance.h"

namespace weft::parallel {

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::kParameter:
      return "parameter";
    case StateKind::kAdamM:
      return "adam_m";
    case StateKind::kAdamV:
      return "adam_v";
    case StateKind::kMaster:
      return "master";
    case StateKind::kScalar:
      return "scalar";
    case StateKind::kBuffer:
      return "buffer";
  }
  return "?";
}

StateSpace StateSpace::from_graph(const core::Graph& g, const core::MoeBalance* balance) {
  StateSpace s;
  auto add = [&](StateTensor t) {
    t.id = StateId(s.tensors_.size());
    s.by_name_[t.name] = t.id;
    if (t.value >= 0) s.by_value_[t.value] = t.id;
    s.tensors_.push_back(std::move(t));
  };
  for (const core::Value& v : g.values()) {
    StateKind kind;
    if (v.role == core::Role::kParameter)
      kind = StateKind::kParameter;
    else if (v.role == core::Role::kOptimizerState && v.name.rfind("adam_m:", 0) == 0)
      kind = StateKind::kAdamM;
    else if (v.role == core::Role::kOptimizerState && v.name.rfind("adam_v:", 0) == 0)
      kind = StateKind::kAdamV;
    else if (v.role == core::Role::kOptimizerState && v.name.rfind("master:", 0) == 0)
      kind = StateKind::kMaster;
    else if (v.role == core::Role::kOptimizerState)
      throw InternalError("optimizer state '" + v.name +
                          "' has no VPS kind (expected adam_m:, adam_v:, master:)");
    else
      continue;
    add(StateTensor{-1, v.name, kind, v.shape, v.dtype, v.id});
  }
  if (balance && balance->mode() == core::MoeBalance::Mode::kLossFree)
    for (int layer : balance->layers())
      add(StateTensor{-1, core::MoeBalance::bias_name(layer), StateKind::kBuffer,
                      {balance->experts()}, core::DType::kF32, -1});
  for (const char* n : {kStepState, kSeedState, kDataCursorState})
    add(StateTensor{-1, n, StateKind::kScalar, {1}, core::DType::kI64, -1});
  return s;
}

StateId StateSpace::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

StateId StateSpace::of_value(int value) const {
  auto it = by_value_.find(value);
  return it == by_value_.end() ? -1 : it->second;
}

int64_t StateBox::numel() const {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

std::vector<PlainPart> plain_parts(const planner::Box& box) {
  std::vector<PlainPart> out(1);
  for (const planner::DimSlice& d : box) {
    std::vector<PlainPart> next;
    for (const PlainPart& p : out)
      for (int64_t i = 0; i < d.count; ++i) {
        PlainPart q = p;
        q.start.push_back(d.start + i * d.stride);
        q.extent.push_back(d.size);
        q.local_start.push_back(i * d.size);
        next.push_back(std::move(q));
      }
    out = std::move(next);
  }
  return out;
}

namespace {

// The state every rank holds whole: buffers and scalars, in StateId order.
void add_whole_on_every_rank(const StateSpace& space, RankLayout& r) {
  for (const StateTensor& t : space.tensors()) {
    if (t.kind != StateKind::kScalar && t.kind != StateKind::kBuffer) continue;
    int local = int(r.locals.size());
    r.locals.push_back(LocalTensor{t.id, t.shape, t.dtype, -1});
    r.boxes.push_back(StateBox{t.id, std::vector<int64_t>(t.shape.size(), 0), t.shape, local,
                               std::vector<int64_t>(t.shape.size(), 0)});
  }
}

}  // namespace

RankLayout layout_of(const StateSpace& space, const planner::Plan& plan, int rank) {
  const planner::RankProgram prog = plan.program(rank);
  RankLayout r;
  for (size_t i = 0; i < prog.tensors.size(); ++i) {
    const planner::TensorDesc& t = prog.tensors[i];
    // Aliases are views (a ZeRO-1 shard of a whole parameter): their root is listed.
    if (!t.persistent || t.alias_of >= 0 || t.value < 0) continue;
    StateId id = space.of_value(t.value);
    if (id < 0) continue;  // a gradient accumulator or the norm: not state
    const StateTensor& st = space.at(id);
    if (t.piece.partial())
      throw InternalError("plan tensor " + std::to_string(i) + " of rank " + std::to_string(rank) +
                          " holds " + st.name + " as a partial sum " + planner::piece_str(t.piece) +
                          ": state must be whole");
    if (t.piece.box.size() != st.shape.size())
      throw InternalError("plan tensor for " + st.name + " has " +
                          std::to_string(t.piece.box.size()) + " dims, the state has " +
                          std::to_string(st.shape.size()) + ": a plan for another graph");
    int local = int(r.locals.size());
    r.locals.push_back(LocalTensor{id, planner::box_shape(t.piece.box), t.dtype, int(i)});
    for (PlainPart& p : plain_parts(t.piece.box))
      r.boxes.push_back(
          StateBox{id, std::move(p.start), std::move(p.extent), local, std::move(p.local_start)});
  }
  add_whole_on_every_rank(space, r);
  return r;
}

Layout layout_of(const StateSpace& space, const planner::Plan& plan, std::vector<int> hosts) {
  Layout l;
  for (int r = 0; r < plan.world(); ++r) l.ranks.push_back(layout_of(space, plan, r));
  l.hosts = std::move(hosts);
  assign_replicas(l);
  return l;
}

Layout whole_layout(const StateSpace& space) {
  Layout l;
  l.ranks.resize(1);
  RankLayout& r = l.ranks[0];
  for (const StateTensor& t : space.tensors()) {
    r.locals.push_back(LocalTensor{t.id, t.shape, t.dtype, -1});
    r.boxes.push_back(StateBox{t.id, std::vector<int64_t>(t.shape.size(), 0), t.shape, t.id,
                               std::vector<int64_t>(t.shape.size(), 0)});
  }
  return l;
}

void assign_replicas(Layout& layout) {
  using Key = std::tuple<StateId, std::vector<int64_t>, std::vector<int64_t>>;
  std::map<Key, int> count;
  for (const RankLayout& r : layout.ranks)
    for (const StateBox& b : r.boxes) ++count[{b.state, b.start, b.extent}];
  std::map<Key, int> seen;
  for (RankLayout& r : layout.ranks)
    for (StateBox& b : r.boxes) {
      Key k{b.state, b.start, b.extent};
      b.replicas = count[k];
      b.replica = seen[k]++;
    }
}

namespace {

using BoxPair = std::pair<std::vector<int64_t>, std::vector<int64_t>>;

// Flat [b, e) of the sub-tensor shape[d..] at index prefix `at` (dims before d fixed).
void flat_boxes(const core::Shape& shape, size_t d, std::vector<int64_t> at, int64_t b, int64_t e,
                std::vector<BoxPair>& out) {
  if (b >= e) return;
  const size_t n = shape.size();
  int64_t inner = 1;
  for (size_t k = d + 1; k < n; ++k) inner *= shape[k];
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> start = at, extent(d, 1);
    start.push_back(r0);
    extent.push_back(r1 - r0);
    for (size_t k = d + 1; k < n; ++k) start.push_back(0), extent.push_back(shape[k]);
    out.push_back({start, extent});
  };
  if (b % inner) {  // head: the rest of a partial row
    int64_t r = b / inner, stop = std::min(e, (r + 1) * inner);
    std::vector<int64_t> sub = at;
    sub.push_back(r);
    flat_boxes(shape, d + 1, sub, b - r * inner, stop - r * inner, out);
    b = stop;
  }
  if (e / inner > b / inner && b < e) rows(b / inner, e / inner);          // whole rows
  if (e % inner && b < e && e / inner >= b / inner && (b % inner == 0)) {  // tail: a partial row
    int64_t r = e / inner;
    std::vector<int64_t> sub = at;
    sub.push_back(r);
    flat_boxes(shape, d + 1, sub, 0, e - r * inner, out);
  }
}

}  // namespace

std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> flat_range_boxes(
    const core::Shape& shape, int64_t begin, int64_t end) {
  std::vector<BoxPair> out;
  if (shape.empty()) {
    if (begin < end) out.push_back({{}, {}});
    return out;
  }
  WEFT_CHECK(begin >= 0 && end <= core::shape_numel(shape), "flat_range_boxes: [", begin, ", ", end,
             ") outside ", core::shape_str(shape));
  flat_boxes(shape, 0, {}, begin, end, out);
  return out;
}

void check_covers(const StateSpace& space, const Layout& layout) {
  for (const StateTensor& t : space.tensors()) {
    // Count coverage on a dense bitmap; layouts under test are small.
    std::vector<uint8_t> hit(size_t(core::shape_numel(t.shape)), 0);
    for (size_t r = 0; r < layout.ranks.size(); ++r)
      for (const StateBox& b : layout.ranks[r].boxes) {
        if (b.state != t.id) continue;
        const LocalTensor& lt = layout.ranks[r].locals.at(size_t(b.local));
        for (size_t d = 0; d < t.shape.size(); ++d) {
          if (b.start[d] < 0 || b.extent[d] < 0 || b.start[d] + b.extent[d] > t.shape[d] ||
              b.local_start[d] + b.extent[d] > lt.shape[d])
            throw InternalError("rank " + std::to_string(r) + " box " + box_str(space, b) +
                                " lies outside " + t.name + core::shape_str(t.shape) +
                                " or its local tensor " + core::shape_str(lt.shape));
        }
        std::vector<int64_t> stride(t.shape.size(), 1);
        for (size_t d = t.shape.size(); d-- > 1;) stride[d - 1] = stride[d] * t.shape[d];
        const int64_t n = b.numel();
        for (int64_t i = 0; i < n; ++i) {
          int64_t rest = i, flat = 0;
          for (size_t d = t.shape.size(); d-- > 0;) {
            flat += (b.start[d] + rest % b.extent[d]) * stride[d];
            rest /= b.extent[d];
          }
          hit[size_t(flat)] = 1;
        }
      }
    auto gap = std::find(hit.begin(), hit.end(), 0);
    if (gap != hit.end())
      throw InternalError("layout leaves element " + std::to_string(gap - hit.begin()) + " of " +
                          t.name + " on no rank");
  }
}

std::string box_str(const StateSpace& space, const StateBox& b) {
  std::ostringstream o;
  o << (b.state >= 0 && b.state < space.size() ? space.at(b.state).name : "?") << "[";
  for (size_t d = 0; d < b.start.size(); ++d)
    o << (d ? ", " : "") << b.start[d] << ":" << b.start[d] + b.extent[d];
  o << "] @local " << b.local;
  return o.str();
}

RankLayout only_locals(const RankLayout& r, const std::vector<int>& keep) {
  std::vector<int> at(r.locals.size(), -1);
  RankLayout out;
  int prev = -1;
  for (int l : keep) {
    WEFT_CHECK(l > prev && l < int(r.locals.size()), "only_locals: local ", l, " after ", prev,
               " of ", r.locals.size(), " (indices ascending, each once)");
    prev = l;
    at[size_t(l)] = int(out.locals.size());
    out.locals.push_back(r.locals[size_t(l)]);
  }
  for (const StateBox& b : r.boxes)
    if (at[size_t(b.local)] >= 0) {
      out.boxes.push_back(b);
      out.boxes.back().local = at[size_t(b.local)];
    }
  return out;
}

Layout remap_ranks(const Layout& layout, const std::vector<int>& to, int world) {
  WEFT_CHECK(int(to.size()) == layout.world(), "remap_ranks: ", to.size(), " targets for ",
             layout.world(), " ranks");
  Layout out;
  out.ranks.resize(size_t(world));
  out.hosts.assign(size_t(world), -1);
  for (int r = 0; r < layout.world(); ++r) {
    WEFT_CHECK(to[size_t(r)] >= 0 && to[size_t(r)] < world, "remap_ranks: rank ", to[size_t(r)],
               " outside ", world);
    out.ranks[size_t(to[size_t(r)])] = layout.ranks[size_t(r)];
    out.hosts[size_t(to[size_t(r)])] = layout.host(r);
  }
  for (int r = 0; r < world; ++r)
    if (out.hosts[size_t(r)] < 0)
      out.hosts[size_t(r)] = world + r;  // a rank outside the layout: its own host
  return out;
}

core::Tensor buffer_tensor(core::MoeBalance* balance, const StateTensor& t) {
  if (t.kind != StateKind::kBuffer)
    throw InternalError("buffer_tensor: state " + t.name + " is a " + state_kind_name(t.kind));
  if (!balance || balance->mode() != core::MoeBalance::Mode::kLossFree)
    throw InternalError("state " + t.name +
                        " is a loss_free routing bias, but the trainer has no loss_free balancing");
  for (int layer : balance->layers())
    if (core::MoeBalance::bias_name(layer) == t.name) {
      core::Tensor& b = balance->bias_tensor(layer);
      if (b.shape() != t.shape || b.dtype() != t.dtype)
        throw InternalError("state " + t.name + " is " + core::dtype_name(t.dtype) +
                            core::shape_str(t.shape) + ", the trainer's bias is " +
                            core::dtype_name(b.dtype()) + core::shape_str(b.shape()));
      return b;
    }
  throw InternalError("state " + t.name + " names no MoE block of the trainer's balancing");
}

std::vector<core::Tensor> allocate_locals(const RankLayout& r) {
  std::vector<core::Tensor> out;
  for (const LocalTensor& l : r.locals) out.push_back(core::Tensor::zeros(l.shape, l.dtype));
  return out;
}

}  // namespace weft::parallel
