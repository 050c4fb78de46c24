// Single-GPU graph executor: runs a device-neutral graph's forward and backward ops for
// one micro-batch and its optimizer ops once per step through the CUDA op table, in bf16
// with f32 master weights (ops_cuda.h has the storage rule). The memory discipline is the
// CPU GraphExecutor's (persistent values for the executor's life; transients allocated on
// first write and freed after their last use), served from one device arena. Everything
// runs in order on one stream, so a freed block may be reused at once.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/arena.h"
#include "core/cuda/gemm.h"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/runtime.h"
#include "core/exec/op_programs.h"
#include "core/graph/graph.h"

namespace weft::core::cuda {

struct ExecutorOptions {
  int device = 0;
  // Bytes of the device arena; 0 takes `arena_fraction` of the free device memory.
  size_t arena_bytes = 0;
  double arena_fraction = 0.9;
  std::string allocator = "caching";  // caching | planned (memory.allocator)
  AttentionImpl attention = attention_impl_from_env();
};

// Not thread-safe: one thread drives an executor. Every method may throw weft::Error on a
// CUDA failure; the executor is then unusable.
class CudaGraphExecutor {
 public:
  // Needs a GPU (weft::Error otherwise) and an f32 graph (NotSupported otherwise).
  // Persistent values start at zero; parameters get their values through upload().
  CudaGraphExecutor(const Graph& g, ExecutorOptions options = {});
  ~CudaGraphExecutor();

  const Graph& graph() const { return g_; }
  StreamHandle stream() const { return stream_.get(); }
  Device device() const { return Device::cuda(options_.device); }

  // Feeds an input (token ids, targets) from the host: shape and dtype must match the
  // graph, and ids are checked against the vocabulary of every op that reads them
  // (InternalError naming the position, as the CPU kernels do). `host` may be pinned.
  void set_input(int value_id, const Tensor& host);

  void zero_grads();
  void run_forward_backward(const StepScalars& s);
  void run_forward(const StepScalars& s);  // transients are released at the end
  void run_optimizer(const StepScalars& s);
  // Before each training step: lets a planned activation arena switch to its plan.
  void begin_step(int64_t step);

  // The device tensor of a persistent value, an input, or a value live right now.
  Tensor& tensor(int value_id);
  // A host copy: floating values as f32 (bf16 widened exactly), others as they are.
  // Synchronises the stream.
  Tensor download(int value_id);
  // Sets a persistent value (a parameter: its master and its bf16 copy) from the host.
  void upload(int value_id, const Tensor& host);
  // The first element of a scalar value as a double (synchronises).
  double read_scalar(int value_id);
  void synchronize() { stream_.synchronize(); }

  memory::AllocatorStats activation_stats() const { return alloc_->activation_stats(); }
  memory::AllocatorStats state_stats() const { return alloc_->state().stats(); }
  const ArenaSegmentSource& arena() const { return arena_->arena(); }

 private:
  void run_ops(const std::vector<int>& program, const std::vector<std::vector<int>>* frees,
               const StepScalars& s);
  void release_transients();
  Tensor* input_for(const Op& op, int v);

  const Graph& g_;
  ExecutorOptions options_;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<DeviceAllocators> alloc_;
  Stream stream_;
  std::unique_ptr<BlasLt> blas_;
  CudaEnv env_;
  std::map<int, Tensor> live_;
  std::map<int, Tensor> compute_copy_;  // parameter id -> bf16 copy
  OpPrograms progs_;
};

}  // namespace weft::core::cuda
