// Graph ops on local pieces: the entry point a multi-rank executor calls for every compute
// instruction of a plan (planner/plan.h). One call runs a whole op on local shards (a plain
// partition) or one part of a custom rule (vocab-parallel cross-entropy, expert-parallel
// MoE, the global norm), so that the pieces plus the plan's collectives reproduce the op.
//
// Core sits below the planner: the executor translates planner::TensorDesc / Operand into
// these structs (PieceDim mirrors planner::DimSlice; split_index/count = Piece::part/parts).
//
// Batch semantics: a split of the batch dim makes each part behave as the per-micro-batch op
// on its rows, as the single-process trainer runs it. Means over rows (cross-entropy's loss,
// MoE's balance statistics and capacity) are taken over the local rows, so
// StepScalars::loss_scale is d(objective)/d(this part's loss), the trainer's 1/parts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/graph/op_table.h"

namespace weft::core {

// One dim of a piece's index set: `count` chunks of `size` elements, chunk i starting at
// start + i*stride (count 1: the range [start, start+size)). The local tensor holds the
// chunks back to back, so its extent is count*size.
struct PieceDim {
  int64_t start = 0, size = 0, count = 1, stride = 0;
  int64_t numel() const { return size * count; }
};
using PieceBox = std::vector<PieceDim>;

struct LocalOperand {
  int slot = -1;         // index into op.inputs (for `in`) or op.outputs (for `out`); -1: scratch
  std::string name;      // scratch: the rule's name ("ce.max", "moe.xe_local", ...); else unused
  Tensor* tensor = nullptr;
  // The piece: its box in the global value (empty: the whole value, i.e. the tensor's own
  // shape from 0) and the global value's shape (empty: the tensor's shape). Scratch tensors
  // use their own shape. Offsets (the vocabulary or expert slice) are read from box starts.
  PieceBox box;
  Shape global_shape;
  int split_index = 0, split_count = 1;  // partial-sum addend split_index of split_count
  bool accumulate = false;  // outputs: add into *tensor (which holds earlier contributions)
  // Non-empty: *tensor is the root storage and the operand is this sub-box of it, in the
  // root's local indices (a ZeRO shard view that strides cannot express, e.g. 1/n of each of
  // the 3 qkv chunks). run_compute copies it in, and out again when written.
  PieceBox within;
  DType dtype = DType::kF32;  // only to allocate an undefined output
};

struct PartContext {
  const Op& op;
  std::string part;  // "" or a custom-rule part: see run_compute
  std::vector<LocalOperand> in, out;
  const StepScalars& scalars;
  memory::Allocator* workspace = nullptr;  // temporaries (nullptr: the host allocator)
  memory::Allocator* outputs = nullptr;    // undefined outputs (nullptr: the host allocator)
  // moe.experts (forward and backward) only: the expert-side rows (moe.xe_local and every
  // tensor like it) arrive in segments, one per (ep team member s in group order, local
  // expert e), source-major: expert_rows[s * E_local + e] rows. Required there: the rows
  // themselves do not say their expert (see moe_expert_counts).
  std::vector<int64_t> expert_rows;
};

// Runs one compute instruction on local tensors.
//
// Operands: `in` and `out` list the instruction's operands in any order; op operands are
// found by slot, scratch operands by name (by position when none is named). An absent
// input slot is a dropped operand (the row-parallel bias on parts other than 0, the
// position table on vocab parts other than 0, the MoE output bias on hidden-unit parts
// other than 0) and is treated as zero. Tensors have the dense local shape (box dims' count*size; expert-side MoE tensors:
// the rows actually received) and may be strided views. An output whose tensor is
// undefined is allocated (contiguous, from ctx.outputs, LocalOperand::dtype) with its
// piece's shape (op values) or the shape the part writes (scratch: moe.he_local has the
// received rows); a defined output must hold that many elements and is written in place.
// accumulate=false overwrites, including parameter gradients that the whole-op bindings
// always add into (they are zeroed first).
//
// part "" (plain partitions and whole ops): every op of the op table on local shapes;
// attention takes local heads = local C / (global C / heads); embedding and
// embedding.bwd with a vocabulary slice (offset = wte's box start) count only tokens in
// [off, off+V_local); cross_entropy.bwd with a vocabulary slice subtracts the one-hot only
// where the target falls in the slice; moe / moe.bwd on a slice of the experts' hidden units
// (missing output bias; the balance-loss gradient only on the part whose ye operand is
// addend 0); adamw on shard views (the plan lists no outputs: p, m, v update in place).
//
// Custom parts, exactly as planner/lower_custom.cc and lower_step.cc emit them:
//   ce.max      in {0 logits}                           out {ce.max (b,t)}: row max of the slice
//   ce.sumexp   in {0 logits, 1 targets, ce.max(all-reduced max)}
//               out {ce.sums (2,b,t)}: [0] sum exp(l - max), [1] the target's logit if in slice
//   ce.finish   in {0 logits, 1 targets, ce.max, ce.sums(all-reduced)}
//               out {0 loss (mean over local rows), 1 probs (the slice)}
//   moe.route   fwd (op moe): in {0 y, 1 router} out {1 aux, 2 probs, 3 route, 4 xe};
//               xe (A rows) holds the kept assignments sorted by expert (the all_to_all_v
//               send buffer), then zero rows; token-side ye, dye and dxe use the same rows
//               (the returns put rows back where they were sent from; padding is ignored)
//   moe.experts fwd: in {moe.xe_local, 2 fc_w, 3 fc_b, 4 proj_w[, 5 proj_b]}
//               out {moe.he_local, moe.ye_local}
//   moe.combine fwd: in {6 ye, 3 route, 2 probs} out {0 out}
//   moe.combine bwd (op moe.bwd): in {0 dout, 11 ye, 8 route, 7 probs}
//               out {moe.dye, moe.dprobs}; dprobs carries the balance-loss term when ye is
//               addend 0 (a hidden-unit split makes ye and dprobs partial sums)
//   moe.experts bwd: in {moe.dye_local, moe.xe_local, moe.he_local, 3 fc_w, 5 proj_w}
//               out {moe.dxe_local, 2 dfc_w, 3 dfc_b, 4 dproj_w, 5 dproj_b}
//   moe.route   bwd: in {moe.dxe, moe.dprobs, 1 y, 2 router, 7 probs, 8 route}
//               out {0 dy, 1 drouter}
//   norm.sumsq  (op global_norm): in {gradients...} out {norm.sumsq (1) f64}: sum of squares
//   norm.finish in {norm.sumsq...} out {0 norm}: sqrt of the sum
// Scratch names for moe operands may be given in any order; they are told apart by name.
//
// Throws NotSupported for a part or op the CPU cannot run, InternalError for operands that
// do not fit the op. Not thread-safe with respect to the tensors it writes; any thread.
void run_compute(PartContext& ctx);

// Expert-parallel MoE dispatch sizes. `route` is moe.route's slot-3 output ((A,2) i32 rows
// (token*k + slot, expert), sorted by expert, padded with -1); returns the kept assignments
// per global expert (size `experts`). The send buffer xe holds them back to back in that
// order, so ep member j (experts [j*E/ep, (j+1)*E/ep)) gets the rows of its experts; the
// executor exchanges these counts so that each member knows, per source and local expert,
// the rows it receives (PartContext::expert_rows). moe.bwd reuses the forward's counts for
// moe.dye -> moe.dye_local, and both returns (ye, dxe) reverse them.
std::vector<int64_t> moe_expert_counts(const Tensor& route, int64_t experts);

// The dense local shape of a box (per dim count*size).
Shape piece_shape(const PieceBox& box);

namespace parts_detail {

// Internal to op_parts*.cc: the operands of one call as contiguous tensors. Views that are
// not contiguous (or given by `within`) are copied in, and written ones copied back by
// finish(); undefined outputs are allocated on first access.
class Operands {
 public:
  explicit Operands(PartContext& ctx);
  // Input of an op slot; nullptr when the instruction does not carry it (dropped).
  const Tensor* in(int slot) const;
  const LocalOperand* in_desc(int slot) const;
  // Scratch input by name; `nth` picks among unnamed scratch inputs when no operand has a name.
  const Tensor& scratch_in(const std::string& name, int nth) const;
  // Every input, in instruction order.
  std::vector<const Tensor*> all_inputs() const;
  // Output of an op slot or a named scratch output. `shape` sizes an undefined tensor (empty:
  // the operand's box). When !accumulate and `zero`, the tensor is zeroed first (for kernels
  // that always add into it). Throws InternalError when absent.
  Tensor& out(int slot, const Shape& shape = {}, bool zero = false);
  Tensor& scratch_out(const std::string& name, int nth, const Shape& shape, bool zero = false);
  bool has_out(int slot) const;
  bool accumulate(int slot) const;
  bool scratch_accumulate(const std::string& name, int nth) const;
  // Inputs the op updates in place (adamw's p, m, v) are copied back too.
  void mark_mutated(int slot);
  void finish();

 private:
  struct Bound {
    LocalOperand* desc = nullptr;
    Tensor local;  // contiguous; shares storage with *desc->tensor when direct
    bool direct = false, ready = false, written = false;
  };
  Tensor& bind_out(Bound& b, const Shape& shape, bool zero);
  int find_scratch(std::vector<Bound>& v, const std::string& name, int nth) const;

  PartContext& ctx_;
  std::vector<Bound> in_, out_;
};

// The MoE forward and backward, whole or by parts (op_parts_moe.cc).
void run_moe(PartContext& ctx, Operands& ops);

}  // namespace parts_detail
}  // namespace weft::core
