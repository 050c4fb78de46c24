// TensorTable: allocation on first write, alias views, gradient zeroing.
#include "parallel/tensor_table.h"

#include <algorithm>

#include "base/check.h"
#include "parallel/regions.h"

namespace weft::parallel {

namespace {
memory::Tag tag_of(const core::Graph& g, const planner::TensorDesc& d) {
  if (d.value < 0) return memory::Tag::kWorkspace;
  switch (g.value(d.value).role) {
    case core::Role::kParameter:
      return memory::Tag::kParameter;
    case core::Role::kGradient:
      return memory::Tag::kGradient;
    case core::Role::kOptimizerState:
      return memory::Tag::kOptimizer;
    default:
      return memory::Tag::kActivation;
  }
}
}  // namespace

TensorTable::TensorTable(const planner::RankProgram& prog, const core::Graph& g,
                         memory::Allocator* transient, memory::Allocator* state, bool defer_state)
    : prog_(prog),
      g_(g),
      transient_(transient ? transient : &memory::default_host_allocator()),
      state_(state ? state : &memory::default_host_allocator()),
      t_(prog.tensors.size()),
      aliases_(prog.tensors.size()) {
  viewable_.assign(t_.size(), 1);
  for (size_t i = 0; i < t_.size(); ++i) {
    const planner::TensorDesc& d = prog_.tensors[i];
    if (d.alias_of < 0) continue;
    aliases_.at(size_t(d.alias_of)).push_back(int(i));
    // A view exists when every dim is the root's or one range inside a one-chunk root dim.
    const planner::Box& rb = prog_.tensors[size_t(d.alias_of)].piece.box;
    for (size_t k = 0; k < rb.size(); ++k) {
      const planner::DimSlice &r = rb[k], &a = d.piece.box.at(k);
      if (!(r == a) && (r.count != 1 || a.count != 1)) viewable_[i] = 0;
    }
    if (!viewable_[size_t(d.alias_of)]) viewable_[i] = 0;
  }
  // Gradient accumulators are not zeroed here: every step zeroes them first
  // (zero_gradients), before anything reads them. Zeroing them twice cost a resize a pass
  // over 400 MB at 100M parameters, once blocks freed by the last trainer are taken back
  // (memory::RecyclingAllocator); fresh memory is faulted in by the first step instead.
  for (size_t i = 0; i < t_.size(); ++i) {
    const planner::TensorDesc& d = prog_.tensors[i];
    if (!d.persistent || d.alias_of >= 0 || (defer_state && state_root(int(i)))) continue;
    const bool gradient = d.value >= 0 && g_.value(d.value).role == core::Role::kGradient;
    t_[i] = allocate(int(i), !gradient);
  }
}

bool TensorTable::state_root(int id) const {
  const planner::TensorDesc& d = desc(id);
  if (!d.persistent || d.alias_of >= 0 || d.value < 0) return false;
  const core::Role r = g_.value(d.value).role;
  return r == core::Role::kParameter || r == core::Role::kOptimizerState;
}

void TensorTable::adopt(int id, core::Tensor t) {
  WEFT_CHECK(state_root(id), "adopt: ", name(id), " is not a state root");
  const planner::TensorDesc& d = desc(id);
  const core::Shape s = planner::box_shape(d.piece.box);
  WEFT_CHECK(t.defined() && t.shape() == s && t.dtype() == d.dtype, "adopt: ", name(id), " is ",
             core::dtype_name(d.dtype), core::shape_str(s), ", the tensor given is ",
             t.defined() ? core::dtype_name(t.dtype()) + core::shape_str(t.shape())
                         : std::string("undefined"));
  WEFT_CHECK(t.is_contiguous() && t.device().is_cpu(), "adopt: the tensor for ", name(id),
             " is not a dense host tensor");
  drop_with_views(id);
  t_.at(size_t(id)) = std::move(t);
}

std::string TensorTable::name(int id) const {
  const planner::TensorDesc& d = desc(id);
  std::string n = d.value >= 0 ? g_.value(d.value).name : d.name;
  return "t" + std::to_string(id) + " (" + n + " " + planner::piece_str(d.piece) + ")";
}

core::Tensor TensorTable::allocate(int id, bool zero) {
  const planner::TensorDesc& d = desc(id);
  memory::Allocator* a = d.persistent ? state_ : transient_;
  core::Shape s = planner::box_shape(d.piece.box);
  return zero ? core::Tensor::zeros(s, d.dtype, a, tag_of(g_, d))
              : core::Tensor::empty(s, d.dtype, a, tag_of(g_, d));
}

bool TensorTable::live(int id) const {
  if (t_.at(size_t(id)).defined()) return true;
  const planner::TensorDesc& d = desc(id);
  return d.alias_of >= 0 && live(d.alias_of);
}

bool TensorTable::viewable(int id) const { return viewable_.at(size_t(id)) != 0; }

TensorTable::Located TensorTable::locate(int id, bool write_it, bool accumulate) {
  if (viewable(id)) return {write_it ? &write(id, accumulate) : &read(id), &desc(id).piece.box};
  int root = desc(id).alias_of;
  while (!viewable(root)) root = desc(root).alias_of;
  return {write_it ? &write(root, accumulate) : &read(root), &desc(root).piece.box};
}

core::Tensor& TensorTable::read(int id) {
  core::Tensor& t = t_.at(size_t(id));
  if (t.defined()) return t;
  const planner::TensorDesc& d = desc(id);
  WEFT_CHECK(d.alias_of >= 0, "read of ", name(id), " before anything wrote it");
  WEFT_CHECK(viewable(id), name(id), " is not a strided view of its root; use locate()");
  core::Tensor& root = read(d.alias_of);
  t = sub_view(root, desc(d.alias_of).piece.box, d.piece.box);
  return t;
}

core::Tensor& TensorTable::write(int id, bool accumulate) {
  core::Tensor& t = t_.at(size_t(id));
  if (t.defined()) return t;
  const planner::TensorDesc& d = desc(id);
  if (d.alias_of >= 0) {
    WEFT_CHECK(viewable(id), name(id), " is not a strided view of its root; use locate()");
    core::Tensor& root = write(d.alias_of, accumulate);
    t = sub_view(root, desc(d.alias_of).piece.box, d.piece.box);
    return t;
  }
  t = allocate(id, accumulate);
  return t;
}

core::Tensor& TensorTable::emplace(int id, const core::Shape& shape) {
  const planner::TensorDesc& d = desc(id);
  core::Tensor& t = t_.at(size_t(id));
  t = core::Tensor::empty(shape, d.dtype, transient_, tag_of(g_, d));
  return t;
}

core::Tensor TensorTable::staging(int64_t n, core::DType dtype) {
  return staging(core::Shape{std::max<int64_t>(n, 1)}, dtype);
}

core::Tensor TensorTable::staging(const core::Shape& shape, core::DType dtype) {
  return core::Tensor::empty(shape, dtype, transient_, memory::Tag::kComm);
}

void TensorTable::release(int id) {
  const planner::TensorDesc& d = desc(id);
  if (d.persistent || d.keep) return;
  t_.at(size_t(id)) = core::Tensor();
  // Views of a released root would keep its storage alive under another name.
  for (int a : aliases_[size_t(id)]) release(a);
}

void TensorTable::zero_gradients() {
  for (size_t i = 0; i < t_.size(); ++i) {
    const planner::TensorDesc& d = prog_.tensors[i];
    if (!d.persistent || d.alias_of >= 0 || d.value < 0) continue;
    if (g_.value(d.value).role == core::Role::kGradient) t_[i].zero_();
  }
}

void TensorTable::release_kept() {
  for (size_t i = 0; i < t_.size(); ++i) {
    const planner::TensorDesc& d = prog_.tensors[i];
    if (!d.keep || d.persistent || d.alias_of >= 0) continue;
    drop_with_views(int(i));
  }
}

void TensorTable::drop_with_views(int id) {
  t_.at(size_t(id)) = core::Tensor();
  for (int a : aliases_[size_t(id)]) drop_with_views(a);
}

}  // namespace weft::parallel
