// CudaGraphExecutor: the CPU executor's allocation discipline on device memory, parameters
// as f32 masters with bf16 compute copies, AdamW batched into multi-tensor launches.
#include "core/cuda/executor.h"

#include <cuda_runtime.h>

#include <functional>

#include "base/check.h"
#include "base/log.h"
#include "base/foreign_checks.h"
#include "core/cuda/kernels.h"
#include "core/cuda/transfer.h"

namespace weft::core::cuda {
namespace {

size_t arena_size(const ExecutorOptions& o) {
  if (o.arena_bytes) return o.arena_bytes;
  size_t free_bytes = 0, total = 0;
  WEFT_CUDA_DEVICE_CHECK(cudaMemGetInfo(&free_bytes, &total));
  size_t want = size_t(double(free_bytes) * o.arena_fraction);
  return want - want % memory::SegmentSource::kSegmentAlignment;
}

}  // namespace

CudaGraphExecutor::CudaGraphExecutor(const Graph& g, ExecutorOptions options)
    : g_(g), options_(options), stream_((set_device(options.device), Stream())) {
  for (const Value& v : g_.values())
    WEFT_ENSURE(v.dtype != DType::kF64 || v.role == Role::kScalar, NotSupported,
                "the CUDA executor trains f32 graphs in mixed precision; '", v.name, "' is ",
                dtype_name(v.dtype));
  arena_ = std::make_unique<DeviceArena>(arena_size(options_));
  alloc_ = std::make_unique<DeviceAllocators>(arena_->source(), options_.allocator);
  blas_ = std::make_unique<BlasLt>();
  env_ = CudaEnv{device(), stream_.get(), blas_.get(), options_.attention};
  for (const Value& v : g_.values()) {
    if (!v.persistent) continue;
    live_[v.id] = Tensor::empty_on(device(), v.shape, v.dtype, alloc_->state(), memory_tag(v));
    zero_device(live_[v.id], stream());
    if (v.role == Role::kParameter) {
      compute_copy_[v.id] =
          Tensor::empty_on(device(), v.shape, DType::kBF16, alloc_->state(), memory_tag(v));
      zero_device(compute_copy_[v.id], stream());
    }
  }
  progs_ = op_programs(g_);
  for (int id : progs_.fwd_bwd) cuda_op_def(g_.op(id).type);  // every op has a binding, or fail now
  for (int id : progs_.opt) cuda_op_def(g_.op(id).type);
  synchronize();
}

CudaGraphExecutor::~CudaGraphExecutor() {
  // Kernels may still read blocks that the maps below return to the arena.
  cudaStreamSynchronize(stream_.get());
  live_.clear();
  compute_copy_.clear();
}

Tensor& CudaGraphExecutor::tensor(int value_id) {
  auto it = live_.find(value_id);
  WEFT_CHECK(it != live_.end(), "value '", g_.value(value_id).name, "' is not live");
  return it->second;
}

void CudaGraphExecutor::set_input(int value_id, const Tensor& host) {
  const Value& v = g_.value(value_id);
  WEFT_CHECK(v.role == Role::kInput, "'", v.name, "' is not an input");
  WEFT_CHECK(host.shape() == v.shape && host.dtype() == v.dtype && host.device().is_cpu(),
             "input '", v.name, "' expects ", shape_str(v.shape), " ", dtype_name(v.dtype),
             " on the host, got ", shape_str(host.shape()), " ", dtype_name(host.dtype()));
  if (v.dtype == DType::kI32) {
    // The kernels cannot throw, so ids are checked here: the vocabulary of each reader.
    for (const Op& op : g_.ops()) {
      int64_t V = -1;
      if (op.type == "embedding" && op.inputs[0] == value_id) V = g_.value(op.inputs[1]).shape[0];
      if (op.type == "cross_entropy" && op.inputs[1] == value_id)
        V = g_.value(op.inputs[0]).shape.back();
      if (V < 0) continue;
      Tensor c = host.contiguous();
      const int32_t* p = c.data<int32_t>();
      for (int64_t i = 0; i < c.numel(); ++i)
        WEFT_CHECK(p[i] >= 0 && p[i] < V, "'", v.name, "': id ", p[i], " at position ", i,
                   " is outside [0, ", V, ")");
    }
  }
  auto it = live_.find(value_id);
  if (it == live_.end())
    it = live_
             .emplace(value_id, Tensor::empty_on(device(), v.shape, v.dtype, alloc_->activations(),
                                                 memory_tag(v)))
             .first;
  cuda::upload(host, it->second, stream());
}

void CudaGraphExecutor::zero_grads() {
  for (const Value& v : g_.values())
    if (v.persistent && v.role == Role::kGradient) zero_device(live_.at(v.id), stream());
}

void CudaGraphExecutor::begin_step(int64_t step) { alloc_->begin_step(step); }

Tensor* CudaGraphExecutor::input_for(const Op& op, int v) {
  if (op.phase != Phase::kOptimizer) {
    auto it = compute_copy_.find(v);
    if (it != compute_copy_.end()) return &it->second;
  }
  return &tensor(v);
}

void CudaGraphExecutor::run_ops(const std::vector<int>& program,
                                const std::vector<std::vector<int>>* frees, const StepScalars& s) {
  memory::Allocator& act = alloc_->activations();
  int phase = -1;
  // AdamW ops are gathered and launched together once the program has passed them all.
  std::vector<std::unique_ptr<CudaOpContext>> adamw;
  auto flush_adamw = [&] {
    std::vector<CudaOpContext*> group;  // consecutive ops with the same hyperparameters
    for (auto& c : adamw) {
      if (!group.empty() && (c->op.attrs.floats != group.front()->op.attrs.floats ||
                             c->in[4] != group.front()->in[4])) {
        run_adamw_group(group);
        group.clear();
      }
      group.push_back(c.get());
    }
    if (!group.empty()) run_adamw_group(group);
    adamw.clear();
  };
  for (size_t i = 0; i < program.size(); ++i) {
    const Op& op = g_.op(program[i]);
    if (int(op.phase) != phase) {  // tell a tracing or planned allocator where the step is
      phase = int(op.phase);
      act.set_phase(memory_phase(op.phase), s.micro_batch);
    }
    auto ctx = std::make_unique<CudaOpContext>(CudaOpContext{op, {}, {}, s, &act, env_, {}});
    for (int v : op.inputs) ctx->in.push_back(input_for(op, v));
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      int v = op.outputs[k];
      if (!live_.count(v)) {
        WEFT_CHECK(!op.accumulate[k], op.type, " accumulates into '", g_.value(v).name,
                   "' before anything wrote it");
        DeviceLayout l = device_layout(g_, op, k, options_.attention);
        live_[v] = Tensor::empty_on(device(), l.shape, l.dtype, act, memory_tag(g_.value(v)));
      }
      ctx->out.push_back(&live_.at(v));
    }
    if (op.type == "adamw") {
      auto it = compute_copy_.find(op.inputs[0]);
      ctx->compute_copy = {it != compute_copy_.end() ? &it->second : nullptr};
      adamw.push_back(std::move(ctx));
      continue;
    }
    if (!adamw.empty()) flush_adamw();  // keep program order for whatever comes after
    cuda_op_def(op.type).run(*ctx);
    if (frees)
      for (int v : (*frees)[i]) live_.erase(v);
  }
  if (!adamw.empty()) flush_adamw();
}

void CudaGraphExecutor::release_transients() {
  for (auto it = live_.begin(); it != live_.end();)
    it = is_transient(g_.value(it->first)) ? live_.erase(it) : std::next(it);
}

void CudaGraphExecutor::run_forward_backward(const StepScalars& s) {
  run_ops(progs_.fwd_bwd, &progs_.free_after_fwd_bwd, s);
  release_transients();
}

void CudaGraphExecutor::run_forward(const StepScalars& s) {
  run_ops(progs_.fwd, &progs_.free_after_fwd, s);
  release_transients();
}

void CudaGraphExecutor::run_optimizer(const StepScalars& s) { run_ops(progs_.opt, nullptr, s); }

Tensor CudaGraphExecutor::download(int value_id) {
  const Tensor& t = tensor(value_id);
  return to_host(t, t.dtype() == DType::kBF16 ? DType::kF32 : t.dtype(), stream());
}

void CudaGraphExecutor::upload(int value_id, const Tensor& host) {
  const Value& v = g_.value(value_id);
  WEFT_CHECK(v.persistent, "upload: '", v.name, "' is not a persistent value");
  cuda::upload(host, tensor(value_id), stream());
  auto it = compute_copy_.find(value_id);
  if (it != compute_copy_.end())
    cast_f32_to_bf16(tensor(value_id).data<float>(), it->second.data<bf16>(), it->second.numel(),
                     stream());
}

double CudaGraphExecutor::read_scalar(int value_id) {
  Tensor h = download(value_id);
  return h.item_at(0);
}

}  // namespace weft::core::cuda
