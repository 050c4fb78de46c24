// The explicit op table. Annotations follow dim_annotation.h: symbols in outputs may be
// split, symbols only in inputs are reductions (partial sums), `^` stays whole.
#include "core/graph/op_table.h"

#include "base/check.h"
#include "core/graph/op_impls.h"

namespace weft::core {

const std::vector<OpDef>& all_op_defs() {
  using namespace ops;
  static const std::vector<OpDef> table = {
      // tokens (B,T), wte (V,C), wpe (T,C) -> x (B,T,C); wpe is optional (Llama has none,
      // and its backward then writes only dwte). Splitting v (vocab-parallel embedding)
      // leaves partial sums: each shard adds only the rows it holds.
      {"embedding", "b t, v c, t c -> b t c", run_embedding, bwd_embedding},
      {"embedding.bwd", "b t c, b t -> v c, t c", run_embedding_bwd},
      // x, w, b -> y, mean, rstd: the channel dim is normalised over, so it stays whole.
      {"layernorm", "b t c^, c^, c^ -> b t c^, b t, b t", run_layernorm, bwd_layernorm},
      {"layernorm.bwd", "b t c^, b t c^, c^, b t, b t -> b t c^, c^, c^", run_layernorm_bwd},
      // y = x w^T + b: n split = column parallel, k split = row parallel (partial sums;
      // the bias must then be added by one part only). The bias is optional (Llama's
      // projections); linear.bwd then writes no bias gradient (has_bias 0).
      {"linear", "b t k, n k, n -> b t n", run_linear, bwd_linear},
      {"linear.bwd", "b t n, b t k, n k -> b t k, n k, n", run_linear_bwd},
      // y = x w^T without bias, only for the LM head (GPT's tied wte, Llama's lm_head or
      // tied embed_tokens): n = vocab, which partition.cc splits into balanced slices.
      {"matmul", "b t k, n k -> b t n", run_linear, bwd_linear},
      {"matmul.bwd", "b t n, b t k, n k -> b t k, n k", run_linear_bwd},
      {"gelu", "b t n -> b t n", run_gelu, bwd_gelu},
      {"gelu.bwd", "b t n, b t n -> b t n", run_gelu_bwd},
      {"add", "b t c, b t c -> b t c", run_add, bwd_add},
      {"add.bwd", "b t c -> b t c, b t c", run_add_bwd},
      // qkv (B,T,3C) with heads contiguous inside q, k and v -> y (B,T,C), att (B,H,T,T).
      // Custom rule: split by heads h (three strided chunks of the qkv dim).
      {"attention", "b t^ (3 h d^) -> b t^ (h d^), b h t^ s^", run_attention, bwd_attention},
      {"attention.bwd", "b t^ (h d^), b t^ (3 h d^), b h t^ s^ -> b t^ (3 h d^)",
       run_attention_bwd},
      // The Llama block. RMSNorm: x, w -> y, rstd; the channel dim stays whole.
      {"rmsnorm", "b t c^, c^ -> b t c^, b t", run_rmsnorm, bwd_rmsnorm},
      {"rmsnorm.bwd", "b t c^, b t c^, c^, b t -> b t c^, c^", run_rmsnorm_bwd},
      // Rotary embedding of q or k (B,T,(h d)): per head and position, so heads split and
      // the head dim and positions stay whole.
      {"rope", "b t^ (h d^) -> b t^ (h d^)", run_rope, bwd_rope},
      {"rope.bwd", "b t^ (h d^) -> b t^ (h d^)", run_rope_bwd},
      // SiLU-gated product silu(gate) * up: element-wise, the hidden dim n splits.
      {"swiglu", "b t n, b t n -> b t n", run_swiglu, bwd_swiglu},
      {"swiglu.bwd", "b t n, b t n, b t n -> b t n, b t n", run_swiglu_bwd},
      // Grouped-query attention: q (B,T,(g r d)), k and v (B,T,(g d)) -> y (B,T,(g r d)),
      // att (B,(g r),T,T). Query head h = g*r + i reads KV head g, so splitting the KV heads
      // g splits every operand into contiguous whole groups (tp by KV heads); r (query heads
      // per KV head) and d are sized from the op's heads, kv_heads and head_dim attributes.
      {"gqa_attention", "b t^ (g r^ d^), b t^ (g d^), b t^ (g d^) -> b t^ (g r^ d^), b (g r^) t^ s^",
       run_gqa_attention, bwd_gqa_attention},
      {"gqa_attention.bwd",
       "b t^ (g r^ d^), b t^ (g r^ d^), b t^ (g d^), b t^ (g d^), b (g r^) t^ s^ -> "
       "b t^ (g r^ d^), b t^ (g d^), b t^ (g d^)",
       run_gqa_attention_bwd},
      // logits (B,T,V), targets (B,T) -> mean loss, probs (B,T,V). Vocab-parallel
      // cross-entropy is a custom rule (max and sum-exp all-reduced across v shards).
      {"cross_entropy", "b t v^, b t -> 1, b t v^", run_cross_entropy, bwd_cross_entropy},
      {"cross_entropy.bwd", "b t v^, b t -> b t v^", run_cross_entropy_bwd},
      // y (B,T,C), router (E,C), fc_w (E,F,C), fc_b (E,F), proj_w (E,C,F), proj_b (E,C)
      // -> out (B,T,C), aux (1), saved routing state. Custom rule: split experts e
      // (expert parallel: tokens dispatched with all_to_all_v).
      {"moe", "b t c, e c, e f c, e f, e c f, e c -> b t c, 1, n e, a, a c, a f, a c",
       run_moe, bwd_moe},
      {"moe.bwd",
       "b t c, b t c, e c, e f c, e f, e c f, e c, n e, a, a c, a f, a c -> b t c, e c, e f c, "
       "e f, e c f, e c",
       run_moe_bwd},
      // The optimizer: a global L2 norm over all gradients, then AdamW per parameter
      // (element-wise, so ZeRO may split any dim of p, g, m and v together).
      {"global_norm", "* -> 1", run_global_norm},
      // Outputs of adamw are its mutated inputs p, m and v (updated in place).
      {"adamw", "p, p, p, p, 1 -> p, p, p", run_adamw, nullptr, {0, 2, 3}},
  };
  return table;
}

const OpDef& op_def(const std::string& type) {
  for (const OpDef& d : all_op_defs())
    if (d.type == type) return d;
  throw InternalError("unknown op type '" + type + "'");
}

}  // namespace weft::core
