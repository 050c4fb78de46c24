// GraphExecutor: allocation on first write, release after last use.
#include "core/exec/executor.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "base/check.h"
#include "base/cpu_time.h"

namespace weft::core {
namespace {

struct Timed {
  double wall = 0, cpu = 0;
};

// `f`'s wall time and, with `cpu`, the thread's CPU time around it (the wall clock read
// inside, so that the wall time holds none of the CPU clock's system calls).
template <class F>
Timed timed(F&& f, bool cpu) {
  const double c0 = cpu ? thread_cpu_s() : 0;
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const auto t1 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(), cpu ? thread_cpu_s() - c0 : 0};
}

}  // namespace

void GraphExecutor::set_profiling(bool on, bool thread_cpu) {
  profiling_ = on;
  profiling_cpu_ = on && thread_cpu;
  if (!profiling_cpu_ || cpu_clock_cost_s_ >= 0) return;
  // The median CPU time of an empty op timed the same way: the clock's own cost, steady
  // within a few percent (550-620 ns here), which a layout model's 2-5 us kernels would
  // otherwise carry 10-80% of.
  std::vector<double> empty(1001);
  for (double& e : empty) e = timed([] {}, true).cpu;
  std::nth_element(empty.begin(), empty.begin() + 500, empty.end());
  cpu_clock_cost_s_ = empty[500];
}

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
      const Timed t = timed([&] { op_def(op.type).run_cpu(ctx); }, profiling_cpu_);
      profile_[op.type] += t.wall;
      if (profiling_cpu_) profile_cpu_[op.type] += t.cpu - cpu_clock_cost_s_;
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
