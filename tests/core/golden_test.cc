// External truth: the single-process trainer against the PyTorch float64 reference runs
// in shared/reference (same weights, tokens and hyperparameters), step by step, with the
// tolerances of shared/reference/README.md. Also: same seed, same numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/config/job_spec.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "core/io/metrics.h"
#include "core/io/safetensors.h"
#include "tests/support/reference.h"

namespace weft::core {
namespace {

const std::string kRef = WEFT_REFERENCE_DIR;

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.item_at(i)));
  return m;
}

// Every tensor of `got` within rel * max|expected| of `expected`, element-wise.
void expect_tensors_near(const NamedTensors& got, const std::map<std::string, Tensor>& expected,
                         double rel, const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (const auto& [name, e] : expected) {
    ASSERT_TRUE(got.count(name)) << what << ": missing " << name;
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.shape(), e.shape()) << name;
    double scale = std::max(max_abs(e), 1e-12), worst = 0;
    for (int64_t i = 0; i < e.numel(); ++i)
      worst = std::max(worst, std::abs(g.item_at(i) - e.item_at(i)) / scale);
    EXPECT_LE(worst, rel) << what << " " << name;
    if (getenv("WEFT_GOLDEN_VERBOSE")) printf("%s %s worst %.3e\n", what.c_str(), name.c_str(), worst);
  }
}

void run_golden(const std::string& name, double loss_rel, DType dtype = DType::kF32) {
  const std::string dir = kRef + "/" + name;
  WEFT_REQUIRE_REFERENCE(dir);
  JobSpec spec = load_job_spec(dir + "/config.yaml");
  data::TokenDataset data = data::TokenDataset::load(spec);
  Trainer trainer(spec, dtype);
  trainer.load_weights(io::load_safetensors(dir + "/init.safetensors"), "--init-weights");
  std::vector<io::MetricsRow> expected = io::read_metrics(dir + "/expected.jsonl");
  ASSERT_EQ(int64_t(expected.size()), spec.train.steps);

  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  for (int64_t s = 0; s < spec.train.steps; ++s) {
    StepStats st = trainer.step(batch);
    const io::MetricsRow& e = expected[s];
    if (getenv("WEFT_GOLDEN_VERBOSE"))
      printf("step %lld loss %.3e norm %.3e aux %.3e\n", (long long)s, st.loss / e.at("loss") - 1,
             st.grad_norm / e.at("grad_norm") - 1, e.has("aux_loss") && e.at("aux_loss") > 0 ? st.aux_loss / e.at("aux_loss") - 1 : 0.0);
    EXPECT_NEAR(st.loss, e.at("loss"), loss_rel * e.at("loss")) << name << " step " << s;
    EXPECT_NEAR(st.grad_norm, e.at("grad_norm"), loss_rel * e.at("grad_norm")) << name << " step " << s;
    EXPECT_NEAR(st.lr, e.at("lr"), 1e-12 + 1e-9 * e.at("lr")) << name << " step " << s;
    if (e.has("aux_loss") && e.at("aux_loss") > 0) {
      EXPECT_NEAR(st.aux_loss, e.at("aux_loss"), loss_rel * e.at("aux_loss")) << name << " step " << s;
    }
    if (s == 0)
      expect_tensors_near(trainer.gradients(), io::load_safetensors(dir + "/grads0.safetensors"),
                          1e-4, name + " step-0 gradients");
  }
  expect_tensors_near(trainer.weights(), io::load_safetensors(dir + "/final.safetensors"), 1e-3,
                      name + " final weights");
}

TEST(Golden, GptTinyMatchesPyTorchReference) { run_golden("gpt-tiny", 1e-4); }
TEST(Golden, MoeTinyMatchesPyTorchReference) { run_golden("moe-tiny", 1e-3); }
// Llama (RMSNorm, rotary positions, grouped-query attention, SwiGLU, untied head), loaded
// by Hugging Face names, at GPT's tolerances.
TEST(Golden, LlamaTinyMatchesPyTorchReference) { run_golden("llama-tiny", 1e-4); }
// In double precision the trainer reproduces the float64 reference to rounding (1e-9 seen
// for GPT): what is left in f32 is precision, not semantics. MoE-tiny's step 9 has a
// near-tie in top-2 routing where the gradient norm is discontinuous, so a 1e-9 change
// in the weights moves it by ~3e-5; hence the looser bound there.
TEST(Golden, GptTinyInDoubleMatchesReferenceClosely) { run_golden("gpt-tiny", 1e-7, DType::kF64); }
TEST(Golden, MoeTinyInDoubleMatchesReferenceClosely) { run_golden("moe-tiny", 1e-4, DType::kF64); }
TEST(Golden, LlamaTinyInDoubleMatchesReferenceClosely) { run_golden("llama-tiny", 1e-7, DType::kF64); }

TEST(Determinism, SameSeedGivesBitwiseIdenticalLosses) {
  const std::string dir = kRef + "/moe-tiny";
  WEFT_REQUIRE_REFERENCE(dir);
  JobSpec spec = load_job_spec(dir + "/config.yaml", {"train.steps=4"});
  data::TokenDataset data = data::TokenDataset::load(spec);
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  std::vector<double> a, b;
  for (auto* out : {&a, &b}) {
    Trainer t(spec);  // seeded init, no weights file
    for (int i = 0; i < 4; ++i) out->push_back(t.step(batch).loss);
  }
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;  // bitwise
  // A different seed changes the initial weights, hence the loss.
  JobSpec other = load_job_spec(dir + "/config.yaml", {"train.steps=4", "train.seed=8"});
  Trainer t(other);
  EXPECT_NE(t.step(batch).loss, a[0]);
}

TEST(BadInput, WeightsForAnotherModelNameTheFlag) {
  const std::string dir = kRef + "/gpt-tiny";
  WEFT_REQUIRE_REFERENCE(dir);
  JobSpec spec = load_job_spec(dir + "/config.yaml");
  Trainer trainer(spec);
  NamedTensors before = trainer.weights();
  try {
    trainer.load_weights(io::load_safetensors(kRef + "/moe-tiny/init.safetensors"), "--init-weights");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--init-weights");
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
  // Nothing changed.
  NamedTensors after = trainer.weights();
  for (const auto& [n, t] : before) EXPECT_EQ(t.item_at(0), after.at(n).item_at(0)) << n;
}

}  // namespace
}  // namespace weft::core

namespace weft::core {
namespace {

// Memory planning changes where tensors live, never what is computed.
TEST(MemoryPlanning, PlannedAllocatorGivesBitwiseTheSameLossesAsCaching) {
  for (const std::string name : {"gpt-tiny", "moe-tiny", "llama-tiny"}) {
    const std::string dir = kRef + "/" + name;
    WEFT_REQUIRE_REFERENCE(dir);
    std::vector<double> losses[2];
    for (int planned = 0; planned < 2; ++planned) {
      JobSpec spec = load_job_spec(dir + "/config.yaml",
                                   {"train.steps=4", std::string("memory.allocator=") +
                                                         (planned ? "planned" : "caching")});
      data::TokenDataset data = data::TokenDataset::load(spec);
      Trainer t(spec);
      for (int i = 0; i < 4; ++i)
        losses[planned].push_back(
            t.step([&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
               data.fill_train(s, b0, n, x, y);
             }).loss);
      ASSERT_TRUE(t.activation_memory());
      EXPECT_EQ(t.activation_memory()->kind(), planned ? "planned" : "caching");
      if (planned) {
        EXPECT_GT(t.activation_memory()->plan_arena_bytes(), 0u) << name;
        EXPECT_GE(t.activation_memory()->plan_arena_bytes(), t.activation_memory()->plan_lower_bound());
      }
    }
    EXPECT_EQ(losses[0], losses[1]) << name;  // bitwise
  }
}

}  // namespace
}  // namespace weft::core
