// Single-device graph executor: runs a graph's forward and backward ops for one
// micro-batch and its optimizer ops once per step, through the CPU kernels. Memory:
// persistent values (parameters, gradients, optimizer state) live for the executor's
// lifetime; every other value is allocated when first written and freed right after its
// last use in the micro-batch program (forward then backward order).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/exec/op_programs.h"
#include "core/graph/graph.h"
#include "core/graph/op_table.h"
#include "memory/allocator.h"

namespace weft::core {

class GraphExecutor {
 public:
  // `activations` serves transient values and op workspaces, `state` the persistent ones;
  // both default to the host allocator and must outlive the executor.
  explicit GraphExecutor(const Graph& g, memory::Allocator* activations = nullptr,
                         memory::Allocator* state = nullptr);

  const Graph& graph() const { return g_; }
  // The tensor of a persistent value, an input, or a value live right now.
  Tensor& tensor(int value_id);
  bool has_tensor(int value_id) const { return live_.count(value_id) > 0; }
  // Feeds an input value (token ids, targets); shape and dtype must match the graph.
  void set_input(int value_id, Tensor t);

  void zero_grads();
  // Forward and backward ops of one micro-batch; parameter gradients accumulate.
  // `before_backward` (optional) runs between the last forward op and the first backward
  // op (aux_loss_global freezes the step's expert shares there).
  void run_forward_backward(const StepScalars& s, const std::function<void()>& before_backward = {});
  // Forward ops only (evaluation); transients are released at the end.
  void run_forward(const StepScalars& s);
  // The optimizer ops (global norm, AdamW): once per step, after all micro-batches.
  void run_optimizer(const StepScalars& s);

  memory::Allocator& activation_allocator() { return *act_; }
  // Serves later transients from `a` (blocks already handed out return to their own
  // allocator, which must outlive them). Used when a memory plan replaces the tracer.
  void set_activation_allocator(memory::Allocator* a) { act_ = a; }

  // Per op type, the seconds spent in its kernels since profiling was enabled (the
  // benchmark's "where the time goes"), wall time. With `thread_cpu`, also the calling
  // thread's CPU time in them (profile_cpu): a single-threaded kernel's cost without the
  // slices other processes took from its core (weft calibrate's op rates; on a busy machine
  // the wall time put config S's world-1 step 19-42% over its run). Off by default: reading
  // that clock is a system call (about 0.56 us here), which profile_cpu subtracts per op.
  void set_profiling(bool on, bool thread_cpu = false);
  const std::map<std::string, double>& profile() const { return profile_; }
  // A kernel's own worker threads are not counted: meaningful at train.threads = 1.
  const std::map<std::string, double>& profile_cpu() const { return profile_cpu_; }

 private:
  void run_ops(const std::vector<int>& program, const std::vector<std::vector<int>>* frees,
               const StepScalars& s, const std::function<void()>& before_backward = {});
  void release_transients();

  const Graph& g_;
  memory::Allocator* act_;
  memory::Allocator* state_;
  std::map<int, Tensor> live_;
  bool profiling_ = false;
  std::map<std::string, double> profile_;
  bool profiling_cpu_ = false;
  std::map<std::string, double> profile_cpu_;
  double cpu_clock_cost_s_ = -1;  // what profile_cpu's clock reads add to one op; < 0: not measured
  OpPrograms progs_;
};

}  // namespace weft::core
