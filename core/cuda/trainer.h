// The single-GPU trainer: core/exec/trainer.h's step (micro-batches, gradient
// accumulation, clipping, AdamW) on the CUDA executor in bf16 with f32 master weights.
// Same JobSpec, same seed-keyed initial weights, same BatchFn, so its losses track the
// CPU trainer's within bf16 rounding.
#pragma once

#include <memory>

#include "core/cuda/arena.h"
#include "core/cuda/executor.h"
#include "core/exec/trainer.h"
#include "core/models/gpt.h"
#include "core/models/weights.h"

namespace weft::core::cuda {

class CudaTrainer {
 public:
  // `spec.train.dtype` may be f32 or bf16: both train in mixed precision here (bf16
  // compute, f32 masters); the graph is built in f32 and is device-neutral.
  // Throws weft::Error when no GPU is usable.
  explicit CudaTrainer(const JobSpec& spec, ExecutorOptions options = {});

  // One optimizer step on the global batch of step current_step(); advances the step.
  // Synchronises once, at the end (to read the loss and the gradient norm).
  // A non-finite loss or gradient norm drops the update (StepStats::applied false).
  StepStats step(const BatchFn& batch);
  // The first parameter (graph order) whose gradient of the last step holds a NaN or an
  // Inf; empty when none does.
  std::string first_nonfinite_gradient();
  // Mean cross-entropy over `batches` micro-batches (forward only).
  double evaluate(const BatchFn& batch, int64_t batches);

  int64_t current_step() const { return step_; }
  const JobSpec& spec() const { return spec_; }
  ModelGraph& model() { return mg_; }
  CudaGraphExecutor& executor() { return *ex_; }
  int64_t num_parameters() const;
  // Host copies (f32) of the master weights / the accumulated gradients, by name.
  NamedTensors weights();
  NamedTensors gradients();
  void load_weights(const NamedTensors& w, const std::string& field);
  memory::AllocatorStats activation_stats() const { return ex_->activation_stats(); }

 private:
  void feed(const BatchFn& batch, int64_t step, int64_t first);

  JobSpec spec_;
  ModelGraph mg_;
  std::unique_ptr<CudaGraphExecutor> ex_;
  PinnedBuffer losses_, norm_;  // read back once per step
  int64_t step_ = 0;
};

// The initial value of parameter `v` for `seed`: exactly core::init_parameters' numbers
// (normal(0, init_std) by CounterRng(seed, stable_hash(name)), or init_fill), on the host.
Tensor initial_parameter(const Value& v, uint64_t seed);

}  // namespace weft::core::cuda
