// CudaTrainer: the CPU trainer's step on the CUDA executor; inputs staged through pinned
// buffers, the losses of all micro-batches read back before the optimizer (which a
// non-finite one skips), the gradient norm after it.
#include "core/cuda/trainer.h"

#include <cuda_runtime.h>

#include <cmath>
#include <functional>

#include "base/check.h"
#include "base/foreign_checks.h"
#include "core/exec/nonfinite.h"
#include "core/graph/autodiff.h"
#include "core/rng.h"

namespace weft::core::cuda {
namespace {

const std::string kStacked = ".moe.experts.";

// Calls f(reference name, parameter id, expert index or -1) for every named piece, in the
// naming of core/models/weights.cc (stacked experts appear one by one).
void for_each_named(const ModelGraph& mg,
                    const std::function<void(const std::string&, int, int64_t)>& f) {
  for (int p : mg.graph.parameters()) {
    const Value& v = mg.graph.value(p);
    size_t at = v.name.find(kStacked);
    if (at == std::string::npos) {
      f(v.name, p, -1);
      continue;
    }
    for (int64_t e = 0; e < v.shape[0]; ++e)
      f(v.name.substr(0, at + kStacked.size()) + std::to_string(e) + "." +
            v.name.substr(at + kStacked.size()),
        p, e);
  }
}

}  // namespace

Tensor initial_parameter(const Value& v, uint64_t seed) {
  Tensor t = Tensor::empty(v.shape, DType::kF32);
  if (v.init_std <= 0.0f) {
    t.fill_(v.init_fill);
    return t;
  }
  CounterRng rng(seed, stable_hash(v.name));
  float* d = t.data<float>();
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = rng.normal(uint64_t(i)) * v.init_std;
  return t;
}

CudaTrainer::CudaTrainer(const JobSpec& spec, ExecutorOptions options) : spec_(spec) {
  // The global-batch balancing state (core/graph/moe_balance.h) is not threaded through the
  // CUDA executor yet; routing without it would silently train plain aux_loss.
  if (spec_.model.arch == "moe-gpt" && spec_.model.moe.balance != "aux_loss")
    throw ConfigError("model.moe.balance", "'" + spec_.model.moe.balance +
                                               "' runs on device: cpu only so far; use aux_loss on cuda");
  WEFT_ENSURE(device_count() > 0, Error, "CUDA trainer: ", no_device_reason());
  options.allocator = spec_.memory.allocator;
  mg_ = build_model(spec_.model, spec_.train.micro_batch, DType::kF32);
  add_training_ops(mg_, spec_.train);
  ex_ = std::make_unique<CudaGraphExecutor>(mg_.graph, options);
  for (int p : mg_.graph.parameters())
    ex_->upload(p, initial_parameter(mg_.graph.value(p), spec_.train.seed));
  const int64_t accum = spec_.train.global_batch / spec_.train.micro_batch;
  const size_t per = 1 + mg_.aux_losses.size();  // the loss, then each balance loss
  losses_ = PinnedBuffer(size_t(std::max<int64_t>(1, accum)) * per * sizeof(float));
  norm_ = PinnedBuffer(sizeof(double));
}

int64_t CudaTrainer::num_parameters() const {
  int64_t n = 0;
  for (int p : mg_.graph.parameters()) n += shape_numel(mg_.graph.value(p).shape);
  return n;
}

void CudaTrainer::feed(const BatchFn& batch, int64_t step, int64_t first) {
  const int64_t mb = spec_.train.micro_batch, T = spec_.model.seq_len;
  // set_input checks the ids on the host and synchronises after its copy (a few hundred
  // KiB per micro-batch: small next to the step).
  Tensor x = Tensor::empty({mb, T}, DType::kI32), y = Tensor::empty({mb, T}, DType::kI32);
  batch(step, first, mb, x.data<int32_t>(), y.data<int32_t>());
  ex_->set_input(mg_.tokens, x);
  ex_->set_input(mg_.targets, y);
}

StepStats CudaTrainer::step(const BatchFn& batch) {
  const int64_t mb = spec_.train.micro_batch, accum = spec_.train.global_batch / mb;
  StepStats st;
  st.step = step_;
  st.lr = learning_rate(spec_.train, step_);
  StepScalars s;
  s.loss_scale = 1.0 / double(accum);
  s.lr = st.lr;
  s.step = step_;
  ex_->begin_step(step_);
  ex_->zero_grads();
  for (int64_t j = 0; j < accum; ++j) {
    s.micro_batch = int(j);
    feed(batch, step_, j * mb);
    ex_->run_forward_backward(s);
    // Queued behind the micro-batch into pinned memory; read after the single
    // synchronisation below.
    const size_t per = 1 + mg_.aux_losses.size();
    for (size_t k = 0; k < per; ++k) {
      int v = k == 0 ? mg_.loss : mg_.aux_losses[k - 1];
      WEFT_CUDA_DEVICE_CHECK(cudaMemcpyAsync(losses_.as<float>() + j * per + k,
                                             ex_->tensor(v).raw_data(), sizeof(float),
                                             cudaMemcpyDeviceToHost, ex_->stream()));
    }
  }
  // The losses decide whether the optimizer runs (a non-finite loss drops the step even
  // when every gradient is finite): one more synchronisation per step, before the optimizer.
  ex_->synchronize();
  const size_t per = 1 + mg_.aux_losses.size();
  for (int64_t j = 0; j < accum; ++j)
    for (size_t k = 0; k < per; ++k)
      (k == 0 ? st.loss : st.aux_loss) += double(losses_.as<float>()[j * per + k]) / double(accum);
  if (std::isfinite(st.loss) && std::isfinite(st.aux_loss)) {
    ex_->run_optimizer(s);  // k_adamw leaves p, m, v as they were when the norm is not finite
    WEFT_CUDA_DEVICE_CHECK(cudaMemcpyAsync(
        norm_.data(), ex_->tensor(mg_.graph.find_value("grad_norm")).raw_data(), sizeof(double),
        cudaMemcpyDeviceToHost, ex_->stream()));
    ex_->synchronize();
    st.grad_norm = norm_.as<double>()[0];
    st.applied = std::isfinite(st.grad_norm);
    if (!st.applied) st.nonfinite = "gradient norm";
  } else {
    double total = 0;  // the failure path: the norm from host copies of the gradients
    for (const auto& [n, g] : gradients()) total += core::sum_squares(g);
    st.grad_norm = std::sqrt(total);
    st.applied = false;
    st.nonfinite = "loss";
  }
  st.tokens = spec_.train.global_batch * spec_.model.seq_len;
  ++step_;
  return st;
}

double CudaTrainer::evaluate(const BatchFn& batch, int64_t batches) {
  const int64_t mb = spec_.train.micro_batch;
  StepScalars s;
  double total = 0;
  for (int64_t j = 0; j < batches; ++j) {
    feed(batch, 0, j * mb);
    ex_->run_forward(s);
    total += ex_->read_scalar(mg_.loss);
  }
  return total / double(std::max<int64_t>(1, batches));
}

NamedTensors CudaTrainer::weights() {
  NamedTensors out;
  std::map<int, Tensor> host;
  for_each_named(mg_, [&](const std::string& n, int p, int64_t e) {
    if (!host.count(p)) host[p] = ex_->download(p);
    out[n] = e < 0 ? host[p] : host[p].select(0, e).contiguous();
  });
  return out;
}

NamedTensors CudaTrainer::gradients() {
  NamedTensors out;
  std::map<int, Tensor> host;
  for_each_named(mg_, [&](const std::string& n, int p, int64_t e) {
    int g = mg_.graph.find_value("grad:" + mg_.graph.value(p).name);
    if (!host.count(p)) host[p] = ex_->download(g);
    out[n] = e < 0 ? host[p] : host[p].select(0, e).contiguous();
  });
  return out;
}

std::string CudaTrainer::first_nonfinite_gradient() {
  for (int p : mg_.graph.parameters()) {
    const std::string& name = mg_.graph.value(p).name;
    if (!core::all_finite(ex_->download(mg_.graph.find_value("grad:" + name)))) return name;
  }
  return {};
}

void CudaTrainer::load_weights(const NamedTensors& named, const std::string& field) {
  const ModelSpec& m = mg_.spec;
  std::string arch = m.arch + " with " + std::to_string(m.layers) + " layers, dim " +
                     std::to_string(m.dim) + ", vocab " + std::to_string(m.vocab);
  // Check everything first (the messages of core/models/weights.cc), so a bad file
  // changes nothing.
  size_t expected = 0;
  for_each_named(mg_, [&](const std::string& n, int p, int64_t e) {
    ++expected;
    Shape want = mg_.graph.value(p).shape;
    if (e >= 0) want.erase(want.begin());
    auto it = named.find(n);
    if (it == named.end())
      throw ConfigError(field, "the weights lack tensor '" + n +
                                   "': they are for another model (this one is " + arch + ")");
    if (it->second.shape() != want)
      throw ConfigError(field, "tensor '" + n + "' has shape " + shape_str(it->second.shape()) +
                                   ", the model (" + arch + ") needs " + shape_str(want));
    if (!core::all_finite(it->second))
      throw ConfigError(field, "tensor '" + n + "' holds NaN or Inf values: give weights with "
                                   "finite values only (e.g. a checkpoint from before the run "
                                   "diverged)");
  });
  if (named.size() != expected)
    throw ConfigError(field, "the weights hold tensors that this model (" + arch +
                                 ") does not have: they are for another model");
  std::map<int, Tensor> host;
  for_each_named(mg_, [&](const std::string& n, int p, int64_t e) {
    if (!host.count(p)) host[p] = Tensor::empty(mg_.graph.value(p).shape, DType::kF32);
    if (e < 0)
      host[p].copy_from(named.at(n));
    else
      host[p].select(0, e).copy_from(named.at(n));
  });
  for (auto& [p, t] : host) ex_->upload(p, t);
}

}  // namespace weft::core::cuda
