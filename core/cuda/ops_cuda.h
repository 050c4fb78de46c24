// The CUDA op table: for every op type of core/graph/op_table.cc a CUDA binding, and the
// rule for where and in which dtype each op output lives on the device. The graph IR stays
// device-neutral (shapes and f32 dtypes as the model builder made them); this table decides
// the mixed-precision storage:
//   parameters         f32 master (optimizer) + bf16 compute copy (forward/backward ops)
//   param. gradients   f32, accumulated across micro-batches; optimizer state f32
//   activations        bf16, and their gradients bf16
//   LayerNorm mean/rstd, losses, scalars   f32 (grad_norm f64, as the graph says)
//   attention's saved probabilities        bf16 (B,H,T,T) with the cuBLASLt attention, or
//                                          the f32 log-sum-exp (B,H,T) with the flash kernel
#pragma once

#include <string>
#include <vector>

#include "core/cuda/gemm.h"
#include "core/cuda/runtime.h"
#include "core/graph/graph.h"
#include "core/graph/op_table.h"
#include "memory/allocator.h"

namespace weft::core::cuda {

// Which attention kernels run: kGemm, the CPU's algorithm on cuBLASLt (tensor cores, O(T^2)
// memory), or kFlash, the fused kernel (O(T) memory, CUDA cores). See kernels.h.
enum class AttentionImpl : uint8_t { kGemm, kFlash };
// WEFT_CUDA_ATTENTION=gemm|flash (default gemm); InternalError for another value.
AttentionImpl attention_impl_from_env();

// What a CUDA binding needs besides its tensors.
struct CudaEnv {
  Device device;
  StreamHandle stream = nullptr;
  BlasLt* blas = nullptr;
  AttentionImpl attention = AttentionImpl::kGemm;
};

// What a CUDA binding sees when it runs one op. Tensors are device tensors. For forward
// and backward ops a parameter input is its bf16 compute copy; for optimizer ops it is
// the f32 master, and `compute_copy[k]` (when not null) is the bf16 copy of input k that
// the op must refresh after changing the master.
struct CudaOpContext {
  const Op& op;
  std::vector<Tensor*> in;
  std::vector<Tensor*> out;
  const StepScalars& scalars;
  memory::Allocator* workspace;  // device memory for op-internal temporaries
  CudaEnv& env;
  std::vector<Tensor*> compute_copy;  // per input; empty or null entries: none
  bool accumulate(size_t k) const { return op.accumulate.at(k); }
  // A device temporary from the workspace allocator, freed when the tensor dies.
  Tensor scratch(const Shape& shape, DType dtype) const;
};

struct CudaOpDef {
  std::string type;
  void (*run)(CudaOpContext& ctx) = nullptr;
  // True for ops that run through the CPU binding with host copies (see ops_cuda.cc).
  bool on_host = false;
};

// Throws InternalError for an unknown type.
const CudaOpDef& cuda_op_def(const std::string& type);
const std::vector<CudaOpDef>& all_cuda_op_defs();

// Shape and dtype of output k of `op` on the device (the storage rule above).
struct DeviceLayout {
  Shape shape;
  DType dtype;
};
DeviceLayout device_layout(const Graph& g, const Op& op, size_t k, AttentionImpl attention);

// All AdamW ops of one optimizer step in as few multi-tensor launches as their
// hyperparameters allow (the binding of a single "adamw" op calls this with one context).
void run_adamw_group(const std::vector<CudaOpContext*>& ops);

}  // namespace weft::core::cuda
