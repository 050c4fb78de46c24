// ParallelTrainer's state as VPS local tensors: views out for a save (state_tensors), and a
// rank's whole state in for a resize (adopt_state), checked before anything changes.
#include <string>
#include <utility>

#include "base/check.h"
#include "base/error.h"
#include "core/graph/moe_balance.h"
#include "parallel/trainer.h"

namespace weft::parallel {

std::vector<core::Tensor> ParallelTrainer::state_tensors(const StateSpace& space,
                                                         const RankLayout& layout) {
  require_state("state_tensors()");
  std::vector<core::Tensor> out;
  TensorTable& t = exec_->tensors();
  for (const LocalTensor& l : layout.locals) {
    const StateTensor& st = space.at(l.state);
    if (st.kind == StateKind::kBuffer) {  // whole on every rank, outside the executor
      core::Tensor b = buffer_tensor(balance_.get(), st);
      WEFT_CHECK(b.shape() == l.shape, "state ", st.name, ": the trainer holds ",
                 core::shape_str(b.shape()), ", the layout ", core::shape_str(l.shape));
      out.push_back(b);
      continue;
    }
    if (st.kind != StateKind::kScalar) {
      WEFT_CHECK(l.plan_tensor >= 0, "state ", st.name, " has no plan tensor on rank ", rank());
      core::Tensor& x = t.read(l.plan_tensor);
      WEFT_CHECK(x.shape() == l.shape, "state ", st.name, ": the executor holds ",
                 core::shape_str(x.shape()), ", the layout ", core::shape_str(l.shape));
      out.push_back(x);
      continue;
    }
    int64_t v = st.name == kSeedState ? int64_t(spec_.train.seed) : step_;
    out.push_back(core::Tensor::from_vector<int64_t>({1}, {v}));
  }
  return out;
}

namespace {

std::string typed_shape(core::DType dt, const core::Shape& s) {
  return std::string(core::dtype_name(dt)) + core::shape_str(s);
}

}  // namespace

void ParallelTrainer::adopt_state(const StateSpace& space, const RankLayout& layout,
                                  std::vector<core::Tensor>& tensors) {
  auto fail = [&](const std::string& what) {
    throw InternalError("adopt_state (rank " + std::to_string(rank()) + "): " + what);
  };
  if (tensors.size() != layout.locals.size())
    fail(std::to_string(tensors.size()) + " tensors for the " +
         std::to_string(layout.locals.size()) + " local tensors of the layout");
  TensorTable& t = exec_->tensors();
  std::vector<char> covered(t.size(), 0);
  int64_t step = -1, cursor = -1;
  size_t buffers = 0;
  // Every check first: a refused state changes nothing.
  for (size_t i = 0; i < layout.locals.size(); ++i) {
    const LocalTensor& l = layout.locals[i];
    if (l.state < 0 || l.state >= space.size())
      fail("local tensor " + std::to_string(i) + " names no state of the space");
    const StateTensor& st = space.at(l.state);
    const core::Tensor& x = tensors[i];
    if (!x.defined()) fail("state " + st.name + " is an undefined tensor");
    if (x.shape() != l.shape || x.dtype() != l.dtype || l.dtype != st.dtype)
      fail("state " + st.name + " is " + typed_shape(x.dtype(), x.shape()) +
           ", the layout holds it as " + typed_shape(l.dtype, l.shape) + " of " +
           typed_shape(st.dtype, st.shape));
    if (!x.device().is_cpu() || !x.is_contiguous())
      fail("state " + st.name + " is not a dense host tensor");
    switch (st.kind) {
      case StateKind::kScalar: {
        const int64_t v = x.data<int64_t>()[0];
        if (st.name == kStepState)
          step = v;
        else if (st.name == kDataCursorState)
          cursor = v;
        else if (st.name == kSeedState) {
          if (uint64_t(v) != spec_.train.seed)
            fail("state seed is " + std::to_string(v) + ", this job's train.seed is " +
                 std::to_string(spec_.train.seed));
        } else {
          fail("scalar state " + st.name + " is unknown to the trainer");
        }
        break;
      }
      case StateKind::kBuffer:
        buffer_tensor(balance_.get(), st);  // InternalError when the trainer has no such bias
        ++buffers;
        break;
      default: {
        const int pt = l.plan_tensor;
        if (pt < 0 || size_t(pt) >= t.size() || !t.state_root(pt) || t.desc(pt).value != st.value)
          fail("state " + st.name + ": the layout names plan tensor " + std::to_string(pt) +
               ", which is not its root in this trainer's plan (a layout of another plan or rank)");
        const planner::TensorDesc& d = t.desc(pt);
        const core::Shape s = planner::box_shape(d.piece.box);
        if (s != l.shape || d.dtype != l.dtype)
          fail("state " + st.name + ": the plan holds " + typed_shape(d.dtype, s) +
               ", the layout " + typed_shape(l.dtype, l.shape));
        if (covered[size_t(pt)]++) fail("state " + st.name + " appears twice in the layout");
      }
    }
  }
  if (step < 0) fail("the layout has no step (or a negative one)");
  if (cursor >= 0 && cursor != step)
    fail("the data cursor " + std::to_string(cursor) + " is not the step " + std::to_string(step));
  for (size_t i = 0; i < t.size(); ++i)
    if (t.state_root(int(i)) && !covered[i]) fail("the layout leaves " + t.name(int(i)) + " out");
  if (balance_ && balance_->mode() == core::MoeBalance::Mode::kLossFree &&
      buffers != balance_->layers().size())
    fail(std::to_string(buffers) + " routing biases for the " +
         std::to_string(balance_->layers().size()) + " loss_free MoE blocks");
  // Install.
  for (size_t i = 0; i < layout.locals.size(); ++i) {
    const StateTensor& st = space.at(layout.locals[i].state);
    if (st.kind == StateKind::kBuffer)
      buffer_tensor(balance_.get(), st).copy_from(tensors[i]);
    else if (st.kind != StateKind::kScalar)
      t.adopt(layout.locals[i].plan_tensor, std::move(tensors[i]));
  }
  tensors.clear();
  step_ = step;
  state_pending_ = false;
  torn_ = false;
}

}  // namespace weft::parallel
