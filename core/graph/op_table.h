// The op table: for every op type, its dimension annotation (for the planner), its CPU
// kernel binding (for the executor) and its backward builder (for autodiff). One
// explicit table, no self-registering statics.
#pragma once

#include <string>
#include <vector>

#include "core/graph/graph.h"
#include "memory/allocator.h"

namespace weft::core {

class MoeBalance;

// Runtime scalars an op may read: set by the trainer for each micro-batch or step.
struct StepScalars {
  double loss_scale = 1.0;  // d(objective)/d(micro-batch loss): 1/accumulation steps (x dp share)
  double lr = 0.0;
  int64_t step = 0;  // optimizer step, from 0
  int micro_batch = -1;  // index of the micro-batch being run (memory-trace spans)
  // MoE balancing over the global batch (aux_loss_global, loss_free; core/graph/
  // moe_balance.h): routings read the bias and the frozen shares from it and record their
  // counts. Null for plain aux_loss.
  MoeBalance* moe_balance = nullptr;
  // Whether routings add their counts to moe_balance: not for forward work repeated for a
  // backward (recompute, a routing pre-pass) nor for evaluation.
  bool record_routing = true;
};

// What a kernel binding sees when it runs one op.
struct OpContext {
  const Op& op;
  std::vector<Tensor*> in;   // in op.inputs order
  std::vector<Tensor*> out;  // in op.outputs order, allocated (or existing when accumulating)
  const StepScalars& scalars;
  memory::Allocator* workspace;  // for op-internal temporaries
  bool accumulate(size_t k) const { return op.accumulate.at(k); }
};

class Autodiff;

struct OpDef {
  std::string type;
  std::string annotation;  // see dim_annotation.h
  void (*run_cpu)(OpContext& ctx) = nullptr;
  // Emits the backward ops of a forward op; nullptr when no gradient flows through it.
  void (*build_backward)(Autodiff& ad, const Op& fwd) = nullptr;
  // Ops that update their inputs in place (the optimizer): indices of mutated inputs.
  std::vector<int> mutates;
};

// Throws InternalError for an unknown type.
const OpDef& op_def(const std::string& type);
const std::vector<OpDef>& all_op_defs();

}  // namespace weft::core
