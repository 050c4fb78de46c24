// Internal: the kernel bindings and backward builders that the op table points to.
// Each binding dispatches on the element type (f32 for training, f64 for gradient
// checks) and calls the CPU kernels.
#pragma once

#include "core/graph/autodiff.h"
#include "core/graph/op_table.h"

namespace weft::core::ops {

// dense transformer ops (ops_dense.cc)
void run_embedding(OpContext&);
void run_embedding_bwd(OpContext&);
void bwd_embedding(Autodiff&, const Op&);
void run_layernorm(OpContext&);
void run_layernorm_bwd(OpContext&);
void bwd_layernorm(Autodiff&, const Op&);
void run_linear(OpContext&);
void run_linear_bwd(OpContext&);
void bwd_linear(Autodiff&, const Op&);
void run_gelu(OpContext&);
void run_gelu_bwd(OpContext&);
void bwd_gelu(Autodiff&, const Op&);
void run_add(OpContext&);
void run_add_bwd(OpContext&);
void bwd_add(Autodiff&, const Op&);
void run_attention(OpContext&);
void run_attention_bwd(OpContext&);
void bwd_attention(Autodiff&, const Op&);
void run_cross_entropy(OpContext&);
void run_cross_entropy_bwd(OpContext&);
void bwd_cross_entropy(Autodiff&, const Op&);

// the Llama block (ops_llama.cc)
void run_rmsnorm(OpContext&);
void run_rmsnorm_bwd(OpContext&);
void bwd_rmsnorm(Autodiff&, const Op&);
void run_rope(OpContext&);
void run_rope_bwd(OpContext&);
void bwd_rope(Autodiff&, const Op&);
void run_swiglu(OpContext&);
void run_swiglu_bwd(OpContext&);
void bwd_swiglu(Autodiff&, const Op&);
void run_gqa_attention(OpContext&);
void run_gqa_attention_bwd(OpContext&);
void bwd_gqa_attention(Autodiff&, const Op&);

// mixture of experts (ops_moe.cc)
void run_moe(OpContext&);
void run_moe_bwd(OpContext&);
void bwd_moe(Autodiff&, const Op&);

// optimizer (ops_optim.cc)
void run_global_norm(OpContext&);
void run_adamw(OpContext&);

}  // namespace weft::core::ops
