// The Llama model builder: Hugging Face parameter names and shapes (untied and tied), weight
// decay on 2-D weights only, and the whole backward graph against central finite
// differences in double (grouped-query attention, rotary positions, RMSNorm, SwiGLU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "core/exec/executor.h"
#include "core/models/gpt.h"
#include "core/rng.h"
#include "memory/host_allocator.h"

namespace weft::core {
namespace {

// 2 layers, dim 16, 4 query heads of size 4 sharing 2 KV heads, SwiGLU width 24.
ModelSpec tiny_llama(bool tied) {
  ModelSpec m;
  m.arch = "llama";
  m.layers = 2;
  m.dim = 16;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_dim = 24;
  m.vocab = 11;
  m.seq_len = 5;
  m.rope_theta = 100.0;  // large angles at these few positions, so rotation errors show
  m.tie_embeddings = tied;
  return m;
}

std::map<std::string, Shape> parameter_shapes(const ModelGraph& mg) {
  std::map<std::string, Shape> out;
  for (int p : mg.graph.parameters()) out[mg.graph.value(p).name] = mg.graph.value(p).shape;
  return out;
}

TEST(LlamaModel, ParametersHaveHuggingFaceNamesAndShapes) {
  ModelGraph mg = build_model(tiny_llama(false), 2);
  std::map<std::string, Shape> want = {
      {"model.embed_tokens.weight", {11, 16}}, {"model.norm.weight", {16}}, {"lm_head.weight", {11, 16}}};
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    want[l + "input_layernorm.weight"] = {16};
    want[l + "self_attn.q_proj.weight"] = {16, 16};
    want[l + "self_attn.k_proj.weight"] = {8, 16};  // 2 KV heads of 4
    want[l + "self_attn.v_proj.weight"] = {8, 16};
    want[l + "self_attn.o_proj.weight"] = {16, 16};
    want[l + "post_attention_layernorm.weight"] = {16};
    want[l + "mlp.gate_proj.weight"] = {24, 16};
    want[l + "mlp.up_proj.weight"] = {24, 16};
    want[l + "mlp.down_proj.weight"] = {16, 24};
  }
  EXPECT_EQ(parameter_shapes(mg), want);
  for (int p : mg.graph.parameters()) {
    const Value& v = mg.graph.value(p);
    EXPECT_EQ(v.decay, v.shape.size() == 2) << v.name;  // no biases; norms do not decay
    if (v.shape.size() == 1) {
      EXPECT_EQ(v.init_fill, 1.0f) << v.name;
    }
  }
  // Tied: the head reads embed_tokens, and there is no lm_head.
  want.erase("lm_head.weight");
  EXPECT_EQ(parameter_shapes(build_model(tiny_llama(true), 2)), want);
}

TEST(LlamaModel, OpsCarryLayersForPipelineStaging) {
  ModelGraph mg = build_model(tiny_llama(false), 2);
  int attention = 0;
  for (int id : mg.graph.ops_in_phase(Phase::kForward)) {
    const Op& op = mg.graph.op(id);
    if (op.scope.rfind("model.layers.", 0) == 0) {
      EXPECT_EQ(op.layer, std::stoi(op.scope.substr(13))) << op.type << " " << op.scope;
    } else {
      EXPECT_EQ(op.layer, -1) << op.type << " " << op.scope;
    }
    if (op.type == "gqa_attention") {
      ++attention;
      EXPECT_EQ(op.attrs.i("heads"), 4);
      EXPECT_EQ(op.attrs.i("kv_heads"), 2);
      EXPECT_EQ(op.attrs.i("head_dim"), 4);
    }
  }
  EXPECT_EQ(attention, 2);
}

struct Fixture {
  ModelGraph mg;
  memory::HostAllocator alloc;
  std::unique_ptr<GraphExecutor> ex;

  explicit Fixture(const ModelSpec& m) {
    mg = build_model(m, 2, DType::kF64);
    add_training_ops(mg, TrainSpec{});
    ex = std::make_unique<GraphExecutor>(mg.graph, &alloc);
    init_parameters(mg, *ex, 42);
    // Perturb every parameter (the norm weights start at exactly 1) so that no gradient is
    // trivially symmetric, and make the weights large enough that attention is not uniform.
    CounterRng rng(7, 0);
    uint64_t k = 0;
    for (int p : mg.graph.parameters()) {
      Tensor& t = ex->tensor(p);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] += 0.2 * double(rng.normal(k++));
    }
    std::vector<int32_t> x(10), y(10);
    for (int i = 0; i < 10; ++i) {
      x[i] = (i * 7 + 3) % int(m.vocab);
      y[i] = (i * 5 + 1) % int(m.vocab);
    }
    ex->set_input(mg.tokens, Tensor::from_vector<int32_t>({2, 5}, x));
    ex->set_input(mg.targets, Tensor::from_vector<int32_t>({2, 5}, y));
  }

  double objective() {
    StepScalars s;
    ex->run_forward(s);
    return ex->tensor(mg.loss).item();
  }
};

void check_gradients(bool tied) {
  Fixture f(tiny_llama(tied));
  StepScalars s;
  f.ex->zero_grads();
  f.ex->run_forward_backward(s);
  int checked = 0;
  double worst = 0;
  for (int p : f.mg.graph.parameters()) {
    const Value& v = f.mg.graph.value(p);
    Tensor& w = f.ex->tensor(p);
    Tensor& g = f.ex->tensor(f.mg.graph.find_value("grad:" + v.name));
    for (int64_t i = 0; i < w.numel(); i += std::max<int64_t>(1, w.numel() / 7)) {
      double* e = w.data<double>() + i;
      const double h = 1e-6, orig = *e;
      *e = orig + h;
      double up = f.objective();
      *e = orig - h;
      double down = f.objective();
      *e = orig;
      double fd = (up - down) / (2 * h), an = g.data<double>()[i];
      // Central differences in double: truncation ~h^2, rounding ~1e-16/h = 1e-10.
      EXPECT_NEAR(an, fd, 1e-8 + 1e-6 * std::abs(fd)) << v.name << "[" << i << "]";
      worst = std::max(worst, std::abs(an - fd));
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", worst);
  ::testing::Test::RecordProperty("worst_abs_error", buf);  // in --gtest_output=xml
}

TEST(LlamaModel, GradientsMatchFiniteDifferences) { check_gradients(false); }
TEST(LlamaModel, TiedHeadGradientsMatchFiniteDifferences) { check_gradients(true); }

}  // namespace
}  // namespace weft::core
