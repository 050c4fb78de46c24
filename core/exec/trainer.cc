// Trainer: gradient accumulation over micro-batches, clipping and AdamW.
#include "core/exec/trainer.h"

#include <cmath>

#include "base/check.h"
#include "core/exec/nonfinite.h"

namespace weft::core {

double learning_rate(const TrainSpec& t, int64_t s) {
  if (s < t.warmup_steps) return t.lr * double(s + 1) / double(t.warmup_steps);
  if (t.schedule == "constant") return t.lr;
  double progress = double(s - t.warmup_steps) / double(std::max<int64_t>(1, t.steps - t.warmup_steps));
  return t.min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (t.lr - t.min_lr);
}

Trainer::Trainer(const JobSpec& spec, DType dtype, memory::Allocator* activations)
    : spec_(spec) {
  if (spec_.train.dtype != "f32")
    throw ConfigError("train.dtype", "'" + spec_.train.dtype +
                                         "' needs device: cuda (mixed precision); the CPU trainer "
                                         "computes in f32, set train.dtype: f32");
  mg_ = build_model(spec_.model, spec_.train.micro_batch, dtype);
  add_training_ops(mg_, spec_.train);
  external_ = activations;
  if (!activations) {
    memory_ = std::make_unique<ActivationMemory>(spec_.memory.allocator);
    activations = &memory_->current();
  }
  ex_ = std::make_unique<GraphExecutor>(mg_.graph, activations);
  init_parameters(mg_, *ex_, spec_.train.seed);
  balance_ = MoeBalance::for_model(spec_.model);
}

memory::AllocatorStats Trainer::activation_stats() const {
  return memory_ ? memory_->stats() : external_->stats();
}

int64_t Trainer::num_parameters() const {
  int64_t n = 0;
  for (int p : mg_.graph.parameters()) n += shape_numel(mg_.graph.value(p).shape);
  return n;
}

void Trainer::feed(const BatchFn& batch, int64_t step, int64_t first) {
  const int64_t mb = spec_.train.micro_batch, T = spec_.model.seq_len;
  Tensor x = Tensor::empty({mb, T}, DType::kI32, &ex_->activation_allocator(), memory::Tag::kActivation);
  Tensor y = Tensor::empty({mb, T}, DType::kI32, &ex_->activation_allocator(), memory::Tag::kActivation);
  batch(step, first, mb, x.data<int32_t>(), y.data<int32_t>());
  ex_->set_input(mg_.tokens, std::move(x));
  ex_->set_input(mg_.targets, std::move(y));
}

StepStats Trainer::step(const BatchFn& batch) {
  const int64_t mb = spec_.train.micro_batch, accum = spec_.train.global_batch / mb;
  StepStats st;
  st.step = step_;
  st.lr = learning_rate(spec_.train, step_);
  StepScalars s;
  s.loss_scale = 1.0 / double(accum);
  s.lr = st.lr;
  s.step = step_;
  if (memory_) {
    memory_->begin_step(step_);
    ex_->set_activation_allocator(&memory_->current());
  }
  s.moe_balance = balance_.get();
  const bool global = balance_ && balance_->mode() == MoeBalance::Mode::kGlobalAux;
  std::function<void()> freeze;
  if (balance_) balance_->begin_step();
  if (global && accum > 1) {
    // aux_loss_global's shares count every micro-batch's routing, and one process runs the
    // micro-batches one after another: route them all first (one more forward per step),
    // then train with the shares fixed and the routing not counted twice.
    for (int64_t j = 0; j < accum; ++j) {
      s.micro_batch = int(j);
      feed(batch, step_, j * mb);
      ex_->run_forward(s);
    }
    balance_->freeze_shares();
    s.record_routing = false;
  } else if (global) {
    freeze = [this] { balance_->freeze_shares(); };
  }
  ex_->zero_grads();
  for (int64_t j = 0; j < accum; ++j) {
    s.micro_batch = int(j);
    feed(batch, step_, j * mb);
    ex_->run_forward_backward(s, freeze);
    st.loss += ex_->tensor(mg_.loss).item() / double(accum);
    for (int a : mg_.aux_losses) st.aux_loss += ex_->tensor(a).item() / double(accum);
  }
  if (global) st.aux_loss = balance_->global_aux_loss();
  const int norm = mg_.graph.find_value("grad_norm");
  if (std::isfinite(st.loss) && std::isfinite(st.aux_loss)) {
    ex_->run_optimizer(s);  // adamw leaves everything as it was when the norm is not finite
    st.grad_norm = ex_->tensor(norm).item();
    st.applied = std::isfinite(st.grad_norm);
    if (!st.applied) st.nonfinite = "gradient norm";
  } else {
    // A non-finite loss drops the step even if every gradient is finite (an overflow in the
    // loss alone); the norm is still reported.
    double total = 0;
    for (int p : mg_.graph.parameters())
      total += sum_squares(ex_->tensor(mg_.graph.find_value("grad:" + mg_.graph.value(p).name)));
    st.grad_norm = std::sqrt(total);
    st.applied = false;
    st.nonfinite = "loss";
  }
  // The loss-free routing bias moves only with an applied step (the optimizer does not read
  // it, so updating it after the optimizer changes no number).
  if (st.applied && balance_ && balance_->mode() == MoeBalance::Mode::kLossFree)
    balance_->update_bias();
  st.tokens = spec_.train.global_batch * spec_.model.seq_len;
  ++step_;
  return st;
}

std::string Trainer::first_nonfinite_gradient() {
  for (int p : mg_.graph.parameters()) {
    const std::string& name = mg_.graph.value(p).name;
    if (!all_finite(ex_->tensor(mg_.graph.find_value("grad:" + name)))) return name;
  }
  return {};
}

double Trainer::evaluate(const BatchFn& batch, int64_t batches) {
  const int64_t mb = spec_.train.micro_batch;
  StepScalars s;
  s.moe_balance = balance_.get();  // loss_free routes with its bias
  s.record_routing = false;
  double total = 0;
  for (int64_t j = 0; j < batches; ++j) {
    feed(batch, 0, j * mb);
    ex_->run_forward(s);
    total += ex_->tensor(mg_.loss).item();
  }
  return total / double(std::max<int64_t>(1, batches));
}

}  // namespace weft::core
