// Plan operands -> core::run_compute (core/graph/op_parts.h).
#include "parallel/compute.h"

#include "base/check.h"
#include "core/graph/op_parts.h"
#include "parallel/regions.h"

namespace weft::parallel {

namespace {

core::PieceBox piece_box(const planner::Box& b) {
  core::PieceBox out;
  out.reserve(b.size());
  for (const planner::DimSlice& d : b) out.push_back({d.start, d.size, d.count, d.stride});
  return out;
}

core::LocalOperand operand(const planner::Operand& o, TensorTable& t, bool is_out) {
  const planner::TensorDesc& d = t.desc(o.tensor);
  core::LocalOperand lo;
  lo.slot = o.slot;
  lo.name = d.value >= 0 ? std::string() : d.name;
  lo.dtype = d.dtype;
  lo.split_index = d.piece.part;
  lo.split_count = d.piece.parts;
  lo.accumulate = is_out && o.accumulate;
  if (d.data_dependent) {
    // Rows known only at run time: the tensor's own shape is its box (scratch semantics);
    // an output is left undefined so that the kernel allocates what it produces.
    if (is_out && !o.accumulate) t.slot(o.tensor) = core::Tensor();
    lo.tensor = is_out ? &t.slot(o.tensor) : &t.read(o.tensor);
    return lo;
  }
  lo.box = piece_box(d.piece.box);
  if (!t.viewable(o.tensor)) {
    // A shard no strided view expresses: hand the root and where the shard sits in it.
    TensorTable::Located l = t.locate(o.tensor, is_out, o.accumulate);
    lo.tensor = l.tensor;
    for (size_t k = 0; k < d.piece.box.size(); ++k) {
      const planner::DimSlice &a = d.piece.box[k], &r = (*l.box)[k];
      int64_t start = local_index(r, a.start);
      int64_t stride = a.count > 1 ? local_index(r, a.start + a.stride) - start : 0;
      lo.within.push_back({start, a.size, a.count, stride});
    }
  } else {
    lo.tensor = is_out ? &t.write(o.tensor, o.accumulate) : &t.read(o.tensor);
  }
  if (d.value >= 0) lo.global_shape = t.graph().value(d.value).shape;
  return lo;
}

}  // namespace

void run_compute_instr(const planner::Instr& instr, TensorTable& t, const core::StepScalars& s,
                       memory::Allocator* workspace, const std::vector<int64_t>& expert_rows) {
  const core::Op& op = t.graph().op(instr.op);
  core::PartContext ctx{op, instr.part, {}, {}, s, workspace, workspace, expert_rows};
  ctx.in.reserve(instr.in.size());
  ctx.out.reserve(instr.out.size());
  for (const planner::Operand& o : instr.in) ctx.in.push_back(operand(o, t, false));
  for (const planner::Operand& o : instr.out) ctx.out.push_back(operand(o, t, true));
  core::run_compute(ctx);
}

}  // namespace weft::parallel
