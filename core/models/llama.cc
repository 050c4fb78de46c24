// Llama graph construction. Shapes: B micro-batch, T sequence, C = dim, H query heads,
// KV key/value heads, hd = C/H, F = ffn width, V vocabulary.
#include "core/models/llama.h"

#include <cmath>
#include <string>

#include "base/check.h"
#include "core/models/builder.h"

namespace weft::core {

using models_detail::Builder;

ModelGraph build_llama(const ModelSpec& m, int64_t micro_batch, DType dt) {
  WEFT_CHECK(m.is_llama(), "build_llama on arch ", m.arch);
  const int64_t B = micro_batch, T = m.seq_len, C = m.dim, V = m.vocab, H = m.heads, KV = m.kv();
  WEFT_CHECK(C % H == 0 && H % KV == 0 && (C / H) % 2 == 0, "llama: dim ", C, ", heads ", H,
             ", kv_heads ", KV, " (validated by the config loader)");
  const int64_t hd = C / H, F = m.mlp_width();
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * float(m.layers));

  ModelGraph mg;
  mg.micro_batch = micro_batch;
  mg.spec = m;
  Builder b{mg, dt};
  mg.tokens = b.act("tokens", {B, T}, DType::kI32, Role::kInput);
  mg.targets = b.act("targets", {B, T}, DType::kI32, Role::kInput);
  int embed = b.param("model.embed_tokens.weight", {V, C}, std);
  int x = b.act("embed.out", {B, T, C});
  b.scope = "embed";  // planner/lower_graph.cc puts "embed*" ops on the first pipeline chunk
  b.op("embedding", {mg.tokens, embed}, {x});

  Attrs norm_attrs;
  norm_attrs.floats["eps"] = m.norm_eps;
  // `prefix` names the weight (model.layers.{i}.input_layernorm), b.scope the activations.
  auto rmsnorm = [&](const std::string& prefix, int in) {
    int w = b.param(prefix + ".weight", {C}, 0.0f, 1.0f);
    int y = b.act("out", {B, T, C});
    int rstd = b.act("rstd", {B, T});
    b.op("rmsnorm", {in, w}, {y, rstd}, norm_attrs);
    return y;
  };
  auto linear = [&](const std::string& name, int in, int64_t fan_in, int64_t fan_out, float wstd) {
    return b.linear(name, in, fan_in, fan_out, wstd, /*bias=*/false);  // Llama has no biases
  };
  auto rope = [&](const std::string& name, int in, int64_t heads) {
    Attrs a;
    a.ints["heads"] = heads;
    a.ints["head_dim"] = hd;
    a.floats["theta"] = m.rope_theta;
    int y = b.act(name, {B, T, heads * hd});
    b.op("rope", {in}, {y}, a);
    return y;
  };
  auto residual = [&](const std::string& name, int a, int c) { return b.residual(name, a, c); };

  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i);
    b.layer = int(i);
    b.scope = layer + ".input_layernorm";
    int y = rmsnorm(b.scope, x);
    b.scope = layer + ".self_attn";
    int q = rope("q_rot", linear("q_proj", y, C, H * hd, std), H);
    int k = rope("k_rot", linear("k_proj", y, C, KV * hd, std), KV);
    int v = linear("v_proj", y, C, KV * hd, std);
    int att_y = b.act("out", {B, T, H * hd});
    int att_p = b.act("probs", {B, H, T, T});
    Attrs heads;
    heads.ints["heads"] = H;
    heads.ints["kv_heads"] = KV;
    heads.ints["head_dim"] = hd;
    b.op("gqa_attention", {q, k, v}, {att_y, att_p}, heads);
    int o = linear("o_proj", att_y, H * hd, C, proj_std);
    b.scope = layer;
    x = residual("res_1", x, o);
    b.scope = layer + ".post_attention_layernorm";
    y = rmsnorm(b.scope, x);
    b.scope = layer + ".mlp";
    int gate = linear("gate_proj", y, C, F, std);
    int up = linear("up_proj", y, C, F, std);
    int h = b.act("swiglu.out", {B, T, F});
    b.op("swiglu", {gate, up}, {h});
    int down = linear("down_proj", h, F, C, proj_std);
    b.scope = layer;
    x = residual("res_2", x, down);
  }

  b.layer = -1;
  b.scope = "model.norm";
  int y = rmsnorm(b.scope, x);
  b.scope = "head";
  // Untied: lm_head.weight (V,C); tied: the head reads embed_tokens, as GPT's wte. Both are
  // the bias-free `matmul`, whose n the planner treats as the vocabulary.
  int head = m.tie_embeddings ? embed : b.param("lm_head.weight", {V, C}, std);
  int logits = b.act("logits", {B, T, V});
  b.op("matmul", {y, head}, {logits});
  mg.loss = b.act("loss", {1}, DType::kF32, Role::kScalar);
  int probs = b.act("probs", {B, T, V});
  b.op("cross_entropy", {logits, mg.targets}, {mg.loss, probs});
  return mg;
}

}  // namespace weft::core
