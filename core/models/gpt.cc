// GPT / MoE-GPT graph construction.
#include "core/models/gpt.h"

#include <cmath>

#include "base/check.h"
#include "core/exec/executor.h"
#include "core/graph/autodiff.h"
#include "core/models/builder.h"
#include "core/models/llama.h"
#include "core/rng.h"

namespace weft::core {

using models_detail::Builder;

ModelGraph build_model(const ModelSpec& m, int64_t micro_batch, DType dt) {
  if (m.is_llama()) return build_llama(m, micro_batch, dt);
  WEFT_CHECK(m.dim % m.heads == 0, "dim ", m.dim, " not divisible by heads ", m.heads);
  ModelGraph mg;
  mg.micro_batch = micro_batch;
  mg.spec = m;
  Builder b{mg, dt};
  const int64_t B = micro_batch, T = m.seq_len, C = m.dim, V = m.vocab, F = m.mlp_ratio * C;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * float(m.layers));

  mg.tokens = b.act("tokens", {B, T}, DType::kI32, Role::kInput);
  mg.targets = b.act("targets", {B, T}, DType::kI32, Role::kInput);
  int wte = b.param("wte.weight", {V, C}, std);
  int wpe = b.param("wpe.weight", {T, C}, std);
  int x = b.act("embed.out", {B, T, C});
  b.scope = "embed";
  b.op("embedding", {mg.tokens, wte, wpe}, {x});

  Attrs ln_attrs;
  ln_attrs.floats["eps"] = 1e-5;
  auto layernorm = [&](const std::string& name, int in) {
    int w = b.param(b.scope + "." + name + ".weight", {C}, 0.0f, 1.0f);
    int bias = b.param(b.scope + "." + name + ".bias", {C}, 0.0f);
    int y = b.act(name + ".out", {B, T, C});
    int mean = b.act(name + ".mean", {B, T});
    int rstd = b.act(name + ".rstd", {B, T});
    b.op("layernorm", {in, w, bias}, {y, mean, rstd}, ln_attrs);
    return y;
  };
  auto linear = [&](const std::string& name, int in, int64_t fan_in, int64_t fan_out, float wstd) {
    return b.linear(name, in, fan_in, fan_out, wstd, /*bias=*/true);
  };
  auto residual = [&](const std::string& name, int a, int c) { return b.residual(name, a, c); };

  for (int64_t i = 0; i < m.layers; ++i) {
    b.layer = int(i);
    b.scope = "h." + std::to_string(i);
    int y = layernorm("ln_1", x);
    b.scope = "h." + std::to_string(i) + ".attn";
    int qkv = linear("qkv", y, C, 3 * C, std);
    int att_y = b.act("out", {B, T, C});
    int att_p = b.act("probs", {B, m.heads, T, T});
    Attrs heads;
    heads.ints["heads"] = m.heads;
    b.op("attention", {qkv}, {att_y, att_p}, heads);
    int proj = linear("proj", att_y, C, C, proj_std);
    b.scope = "h." + std::to_string(i);
    x = residual("res_1", x, proj);
    y = layernorm("ln_2", x);
    int mlp_out;
    if (m.is_moe_layer(i)) {
      b.scope = "h." + std::to_string(i) + ".moe";
      const int64_t E = m.moe.experts, N = B * T, A = N * m.moe.top_k;
      int router = b.param(b.scope + ".router.weight", {E, C}, std);
      int fcw = b.param(b.scope + ".experts.fc.weight", {E, F, C}, std, 0.0f, true);
      int fcb = b.param(b.scope + ".experts.fc.bias", {E, F}, 0.0f, 0.0f, true);
      int pw = b.param(b.scope + ".experts.proj.weight", {E, C, F}, proj_std, 0.0f, true);
      int pb = b.param(b.scope + ".experts.proj.bias", {E, C}, 0.0f, 0.0f, true);
      mlp_out = b.act("out", {B, T, C});
      int aux = b.act("aux_loss", {1}, DType::kF32, Role::kScalar);
      int probs = b.act("probs", {N, E});
      int route = b.act("route", {A, 2}, DType::kI32);
      int xe = b.act("xe", {A, C});
      int he = b.act("he", {A, F});
      int ye = b.act("ye", {A, C});
      Attrs a;
      a.ints["top_k"] = m.moe.top_k;
      a.floats["capacity_factor"] = m.moe.capacity_factor;
      a.floats["aux_coef"] = m.moe.aux_coef;
      b.op("moe", {y, router, fcw, fcb, pw, pb}, {mlp_out, aux, probs, route, xe, he, ye}, a);
      mg.aux_losses.push_back(aux);
    } else {
      b.scope = "h." + std::to_string(i) + ".mlp";
      int h = linear("fc", y, C, F, std);
      int gh = b.act("gelu.out", {B, T, F});
      b.op("gelu", {h}, {gh});
      mlp_out = linear("proj", gh, F, C, proj_std);
    }
    b.scope = "h." + std::to_string(i);
    x = residual("res_2", x, mlp_out);
  }

  b.layer = -1;
  {
    // ln_f and the tied LM head.
    b.scope = "ln_f";
    int w = b.param("ln_f.weight", {C}, 0.0f, 1.0f);
    int bias = b.param("ln_f.bias", {C}, 0.0f);
    int y = b.act("out", {B, T, C});
    int mean = b.act("mean", {B, T});
    int rstd = b.act("rstd", {B, T});
    b.op("layernorm", {x, w, bias}, {y, mean, rstd}, ln_attrs);
    b.scope = "head";
    int logits = b.act("logits", {B, T, V});
    b.op("matmul", {y, wte}, {logits});
    mg.loss = b.act("loss", {1}, DType::kF32, Role::kScalar);
    int probs = b.act("probs", {B, T, V});
    b.op("cross_entropy", {logits, mg.targets}, {mg.loss, probs});
  }
  return mg;
}

void add_training_ops(ModelGraph& mg, const TrainSpec& t) {
  Autodiff ad(mg.graph);
  std::vector<int> losses = {mg.loss};
  losses.insert(losses.end(), mg.aux_losses.begin(), mg.aux_losses.end());
  ad.run(losses);
  append_optimizer(mg.graph, t.betas[0], t.betas[1], t.eps, t.weight_decay, t.grad_clip);
}

void init_parameters(const ModelGraph& mg, GraphExecutor& ex, uint64_t seed) {
  for (int p : mg.graph.parameters()) {
    const Value& v = mg.graph.value(p);
    Tensor& t = ex.tensor(p);
    if (v.init_std <= 0.0f) {
      t.fill_(v.init_fill);
      continue;
    }
    CounterRng rng(seed, stable_hash(v.name));
    int64_t n = t.numel();
    if (t.dtype() == DType::kF32) {
      float* d = t.data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] = rng.normal(uint64_t(i)) * v.init_std;
    } else {
      double* d = t.data<double>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] = double(rng.normal(uint64_t(i))) * v.init_std;
    }
  }
}

}  // namespace weft::core
