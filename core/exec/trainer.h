// The single-process trainer: one optimizer step = the global batch in micro-batches
// (gradient accumulation), then clipping and AdamW. It owns the model graph and its
// executor; data comes through a BatchFn so the caller decides where tokens come from.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/config/job_spec.h"
#include "core/exec/activation_memory.h"
#include "core/exec/executor.h"
#include "core/graph/moe_balance.h"
#include "core/models/gpt.h"
#include "core/models/weights.h"

namespace weft::core {

// The learning rate of optimizer step `step` (from 0): linear warm-up, then cosine down
// to min_lr over the remaining steps, or constant.
double learning_rate(const TrainSpec& t, int64_t step);

// Fills x and y, each (count, T) int32, with sequences [first, first + count) of the
// global batch of optimizer step `step`.
using BatchFn =
    std::function<void(int64_t step, int64_t first, int64_t count, int32_t* x, int32_t* y)>;

struct StepStats {
  int64_t step = 0;
  double loss = 0;      // mean cross-entropy of the global batch, before the update
  // The summed balance losses: mean over micro-batches (aux_loss), of the global batch
  // (aux_loss_global), 0 under loss_free.
  double aux_loss = 0;
  double grad_norm = 0; // before clipping
  double lr = 0;
  int64_t tokens = 0;
  // False when the loss or the gradient norm was not finite: the optimizer left the
  // parameters, the moments and the MoE routing bias as they were (the step still counts:
  // the step index, hence the data, the learning rate and Adam's bias correction, moves on).
  bool applied = true;
  std::string nonfinite;  // when !applied: "loss" or "gradient norm"
};

class Trainer {
 public:
  // Builds the training graph for `spec` and initialises the parameters from the seed.
  // `activations` serves the per-micro-batch memory; by default the trainer owns an
  // arena of the kind `memory.allocator` names (caching or planned).
  explicit Trainer(const JobSpec& spec, DType dtype = DType::kF32,
                   memory::Allocator* activations = nullptr);

  // One optimizer step on the global batch of step current_step(); advances the step. A
  // non-finite loss or gradient norm drops the update (StepStats::applied false).
  StepStats step(const BatchFn& batch);
  // The first parameter (graph order) whose gradient of the last step holds a NaN or an
  // Inf; empty when none does.
  std::string first_nonfinite_gradient();
  // Mean cross-entropy over `batches` micro-batches drawn from `batch` (forward only).
  double evaluate(const BatchFn& batch, int64_t batches);

  int64_t current_step() const { return step_; }
  void set_current_step(int64_t s) { step_ = s; }
  const JobSpec& spec() const { return spec_; }
  ModelGraph& model() { return mg_; }
  GraphExecutor& executor() { return *ex_; }
  NamedTensors weights() { return export_weights(mg_, *ex_); }
  NamedTensors gradients() { return export_weights(mg_, *ex_, true); }
  void load_weights(const NamedTensors& w, const std::string& field) {
    import_weights(mg_, *ex_, w, field);
  }
  int64_t num_parameters() const;
  // Statistics of the activation arena (the caller's allocator when one was given).
  memory::AllocatorStats activation_stats() const;
  const ActivationMemory* activation_memory() const { return memory_.get(); }
  // The global-batch expert balancing state (aux_loss_global, loss_free); null otherwise.
  MoeBalance* moe_balance() { return balance_.get(); }

 private:
  void feed(const BatchFn& batch, int64_t step, int64_t first);

  JobSpec spec_;
  std::unique_ptr<ActivationMemory> memory_;  // when the trainer owns its arena
  memory::Allocator* external_ = nullptr;
  ModelGraph mg_;
  std::unique_ptr<GraphExecutor> ex_;
  std::unique_ptr<MoeBalance> balance_;
  int64_t step_ = 0;
};

}  // namespace weft::core
