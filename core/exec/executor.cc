// GraphExecutor: allocation on first write, release after last use.
#include "core/exec/executor.h"

#include <chrono>
#include <functional>

#include "base/check.h"

namespace weft::core {

GraphExecutor::GraphExecutor(const Graph& g, memory::Allocator* activations,
                             memory::Allocator* state)
    : g_(g),
      act_(activations ? activations : &memory::default_host_allocator()),
      state_(state ? state : &memory::default_host_allocator()) {
  for (const Value& v : g_.values())
    if (v.persistent) live_[v.id] = Tensor::zeros(v.shape, v.dtype, state_, memory_tag(v));
  progs_ = op_programs(g_);
}

Tensor& GraphExecutor::tensor(int value_id) {
  auto it = live_.find(value_id);
  WEFT_CHECK(it != live_.end(), "value '", g_.value(value_id).name, "' is not live");
  return it->second;
}

void GraphExecutor::set_input(int value_id, Tensor t) {
  const Value& v = g_.value(value_id);
  WEFT_CHECK(v.role == Role::kInput, "'", v.name, "' is not an input");
  WEFT_CHECK(t.shape() == v.shape && t.dtype() == v.dtype, "input '", v.name, "' expects ",
             shape_str(v.shape), " ", dtype_name(v.dtype), ", got ", shape_str(t.shape()), " ",
             dtype_name(t.dtype()));
  live_[value_id] = std::move(t);
}

void GraphExecutor::zero_grads() {
  for (const Value& v : g_.values())
    if (v.persistent && v.role == Role::kGradient) live_.at(v.id).zero_();
}

void GraphExecutor::run_ops(const std::vector<int>& program,
                            const std::vector<std::vector<int>>* frees, const StepScalars& s,
                            const std::function<void()>& before_backward) {
  int phase = -1;
  for (size_t i = 0; i < program.size(); ++i) {
    const Op& op = g_.op(program[i]);
    if (int(op.phase) != phase) {  // tell a tracing or planned allocator where the step is
      if (op.phase == Phase::kBackward && before_backward) before_backward();
      phase = int(op.phase);
      act_->set_phase(memory_phase(op.phase), s.micro_batch);
    }
    OpContext ctx{op, {}, {}, s, act_};
    for (int v : op.inputs) ctx.in.push_back(&tensor(v));
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      int v = op.outputs[k];
      if (!live_.count(v)) {
        WEFT_CHECK(!op.accumulate[k], op.type, " accumulates into '", g_.value(v).name,
                   "' before anything wrote it");
        const Value& val = g_.value(v);
        live_[v] = Tensor::empty(val.shape, val.dtype, act_, memory_tag(val));
      }
      ctx.out.push_back(&live_.at(v));
    }
    if (profiling_) {
      auto t0 = std::chrono::steady_clock::now();
      op_def(op.type).run_cpu(ctx);
      profile_[op.type] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      op_def(op.type).run_cpu(ctx);
    }
    if (frees)
      for (int v : (*frees)[i]) live_.erase(v);
  }
}

void GraphExecutor::release_transients() {
  for (auto it = live_.begin(); it != live_.end();)
    it = is_transient(g_.value(it->first)) ? live_.erase(it) : std::next(it);
}

void GraphExecutor::run_forward_backward(const StepScalars& s,
                                         const std::function<void()>& before_backward) {
  run_ops(progs_.fwd_bwd, &progs_.free_after_fwd_bwd, s, before_backward);
  release_transients();
}

void GraphExecutor::run_forward(const StepScalars& s) {
  run_ops(progs_.fwd, &progs_.free_after_fwd, s);
  release_transients();
}

void GraphExecutor::run_optimizer(const StepScalars& s) { run_ops(progs_.opt, nullptr, s); }

}  // namespace weft::core
