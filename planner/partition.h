// Phase 1, transformation: an op of the graph becomes sub-ops, each reading and writing
// pieces (box + value split) of the global values. Splits follow the op table's dim
// annotations (a symbol in an output splits that output; a symbol only in inputs leaves
// partial sums; a frozen `^` symbol refuses), with custom rules where the annotation alone
// would be wrong: row-parallel bias and vocab-parallel position embedding (added by part 0
// only), vocab-parallel cross-entropy, MoE by experts (token dispatch) and by expert
// hidden units. Backward ops take the same splits as their forward op: their annotations
// share its symbols.
#pragma once

#include <string>
#include <vector>

#include "core/graph/graph.h"
#include "planner/box.h"

namespace weft::planner {

struct SubTensor {
  int value = -1;
  Piece piece;
  // This sub-op does not take the operand (a bias or position table that only part 0
  // adds, so that the partial sums add it once).
  bool dropped = false;
  // The dim that the batch split cut (-1: none); plans shift it per data-parallel rank.
  int batch_dim = -1;
  // A partial sum over the batch split (a micro-batch's loss): its addend index moves with
  // the micro-batch instead of a box.
  bool batch_partial = false;
};

struct Split {
  std::string symbol;
  int64_t n = 1, index = 0;
  // > 1: a whole dim carrying the symbol is cut into strided chunks, `groups` of them
  // (the qkv projection split to match attention's (3 h d) by heads).
  int64_t groups = 1;
  bool operator==(const Split& o) const = default;
};

struct SubOp {
  int op = -1;
  std::vector<SubTensor> ins;   // per op.inputs
  std::vector<SubTensor> outs;  // per op.outputs
  std::vector<Split> splits;    // applied so far, in order
  // Custom lowering: cross-entropy split over the vocabulary (run as parts whose row max and
  // sums are V-max and V-sum values across the parts; phase 3 derives their joining), MoE
  // split over experts (tokens dispatched with all_to_all_v).
  bool vocab_parallel = false;
  bool expert_parallel = false;
  int64_t expert_parts = 1, expert_index = 0;
};

// The op with every operand whole (boxes = the values' global shapes, no value split).
SubOp whole_op(const core::Graph& g, int op);

// Part k of splitting `base` along `symbol` into n. Throws NotSupported when the symbol
// is frozen or absent for this op type, InternalError when a dim does not divide. The
// vocabulary (embedding v, head n, cross-entropy v) need not divide: its parts are
// DimSlice::balanced_part, sizes differing by at most one.
SubOp partition_one(const core::Graph& g, const SubOp& base, const std::string& symbol, int64_t n,
                    int64_t k, int64_t groups = 1);
// All n parts.
std::vector<SubOp> partition(const core::Graph& g, const SubOp& base, const std::string& symbol,
                             int64_t n, int64_t groups = 1);
// n identical copies: every part computes the whole sub-op.
std::vector<SubOp> replicate(const SubOp& base, int64_t n);

// The sizes of an op's annotation symbols (from the global shapes; grouped symbols such
// as the d of (3 h d) solved from the group's dim). Throws InternalError if unresolved.
int64_t symbol_size(const core::Graph& g, int op, const std::string& symbol);
// Index into the annotation's outputs of op.outputs[k] (backward ops drop outputs whose
// gradient is not needed: attribute skip_out<i>).
int annotation_output(const core::Op& op, int k);

}  // namespace weft::planner
