// Model builders: GPT and MoE-GPT as forward graphs (shared/reference/README.md has
// the exact semantics), plus the training extension (autodiff and optimizer ops).
#pragma once

#include <vector>

#include "core/config/job_spec.h"
#include "core/graph/graph.h"

namespace weft::core {

struct ModelGraph {
  Graph graph;
  int tokens = -1;   // input (B,T) i32
  int targets = -1;  // input (B,T) i32
  int loss = -1;     // scalar: mean cross-entropy of the micro-batch
  std::vector<int> aux_losses;  // scalar per MoE layer: its balance loss
  int64_t micro_batch = 0;
  ModelSpec spec;
};

// The forward graph for micro-batches of `micro_batch` sequences. Parameters carry
// their initialisation (init_std / init_fill) and whether weight decay applies.
// Expert weights are stacked per layer: h.{i}.moe.experts.fc.weight is (E, F, C).
ModelGraph build_model(const ModelSpec& spec, int64_t micro_batch, DType dtype = DType::kF32);

// Appends the backward ops (seeded at the loss and the balance losses) and the
// optimizer ops (global norm, AdamW with the spec's hyperparameters).
void add_training_ops(ModelGraph& mg, const TrainSpec& train);

// Fills every parameter from its initialiser, keyed by (seed, parameter name, element
// index) through the counter-based RNG: the same numbers for any layout or rank.
class GraphExecutor;
void init_parameters(const ModelGraph& mg, GraphExecutor& ex, uint64_t seed);

}  // namespace weft::core
