// Steps that go non-finite (train.on_nonfinite): the optimizer program leaves every state it
// would update as it was when a gradient holds a NaN, a dropped step leaves the trainer where
// a run that never took it would be, and the keys parse and validate.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "base/error.h"
#include "core/config/job_spec.h"
#include "core/data/dataset.h"
#include "core/exec/nonfinite.h"
#include "core/exec/trainer.h"

namespace weft::core {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

JobSpec tiny(const std::string& config, std::vector<std::string> sets = {}) {
  sets.insert(sets.end(), {"train.eval_every=0", "train.threads=1", "train.steps=8",
                           "train.warmup_steps=0"});
  return load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/" + config, sets);
}

// Copies of every persistent parameter and optimizer moment, by value name.
std::map<std::string, Tensor> optimizer_state(Trainer& t) {
  std::map<std::string, Tensor> out;
  const Graph& g = t.model().graph;
  for (size_t v = 0; v < g.values().size(); ++v) {
    const Value& val = g.value(int(v));
    if (val.role == Role::kParameter || val.role == Role::kOptimizerState)
      out[val.name] = t.executor().tensor(int(v)).clone();
  }
  return out;
}

void expect_equal(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    std::vector<float> x = t.to_vector<float>(), y = b.at(name).to_vector<float>();
    ASSERT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_TRUE(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))
          << name << "[" << i << "]: " << x[i] << " vs " << y[i];
  }
}

TEST(Nonfinite, AllFiniteSeesOneNaNOrInfAnywhere) {
  Tensor t = Tensor::zeros({3, 5}, DType::kF32);
  EXPECT_TRUE(all_finite(t));
  t.data<float>()[7] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(all_finite(t));
  EXPECT_FALSE(all_finite(t.slice(0, 1, 2)));  // the row that holds it, as a view
  EXPECT_TRUE(all_finite(t.slice(0, 0, 1)));
  t.data<float>()[7] = kNaN;
  EXPECT_FALSE(all_finite(t));
  // Large but finite: the sum of squares overflows f32 but not the check.
  Tensor big = Tensor::zeros({4}, DType::kF32);
  big.fill_(3e38);
  EXPECT_TRUE(all_finite(big));
}

// The optimizer program itself (global_norm, then adamw per parameter): a NaN in one
// gradient makes the norm NaN and every parameter and moment stays bitwise as it was.
TEST(Nonfinite, OptimizerLeavesEveryStateWhenOneGradientIsNaN) {
  JobSpec spec = tiny("gpt-tiny.yaml");
  data::TokenDataset data = data::TokenDataset::load(spec);
  Trainer t(spec);
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  ASSERT_TRUE(t.step(batch).applied);  // moments are non-zero from here
  std::map<std::string, Tensor> before = optimizer_state(t);
  const Graph& g = t.model().graph;
  int grad = g.find_value("grad:h.1.mlp.fc.weight");
  ASSERT_GE(grad, 0);
  t.executor().tensor(grad).data<float>()[3] = kNaN;
  StepScalars s;
  s.lr = 1e-3;
  s.step = 1;
  t.executor().run_optimizer(s);
  EXPECT_TRUE(std::isnan(t.executor().tensor(g.find_value("grad_norm")).item()));
  expect_equal(optimizer_state(t), before);
  EXPECT_EQ(t.first_nonfinite_gradient(), "h.1.mlp.fc.weight");
  // The same program with the NaN gone applies the update.
  t.executor().tensor(grad).data<float>()[3] = 0.0f;
  t.executor().run_optimizer(s);
  EXPECT_TRUE(std::isfinite(t.executor().tensor(g.find_value("grad_norm")).item()));
  EXPECT_NE(optimizer_state(t).at("h.1.mlp.fc.weight").to_vector<float>(),
            before.at("h.1.mlp.fc.weight").to_vector<float>());
}

// A step whose loss is NaN (one weight poisoned for that step only) is dropped: the
// parameters, moments and (loss_free) routing biases stay, the step index moves on, and the
// following steps equal those of a run that went from step 0 straight to step 2.
void skipped_step_equals_run_without_it(const JobSpec& spec) {
  data::TokenDataset data = data::TokenDataset::load(spec);
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  Trainer a(spec), b(spec);
  ASSERT_TRUE(a.step(batch).applied);
  ASSERT_TRUE(b.step(batch).applied);

  const Graph& g = a.model().graph;
  float* w = a.executor().tensor(g.find_value("ln_f.weight")).data<float>();
  const float kept = w[5];
  std::map<std::string, Tensor> before = optimizer_state(a);
  std::vector<float> bias_before;
  if (a.moe_balance()) bias_before = a.moe_balance()->bias_tensor(0).to_vector<float>();
  w[5] = kNaN;
  StepStats st = a.step(batch);
  EXPECT_FALSE(st.applied);
  EXPECT_EQ(st.nonfinite, "loss");
  EXPECT_TRUE(std::isnan(st.loss));
  EXPECT_EQ(a.current_step(), 2);
  w[5] = kept;
  expect_equal(optimizer_state(a), before);
  if (a.moe_balance()) {
    EXPECT_EQ(a.moe_balance()->bias_tensor(0).to_vector<float>(), bias_before);
  }

  b.set_current_step(2);  // the run in which step 1's update never happened
  for (int k = 0; k < 3; ++k) {
    StepStats sa = a.step(batch), sb = b.step(batch);
    EXPECT_TRUE(sa.applied);
    EXPECT_EQ(sa.loss, sb.loss) << "step " << sa.step;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "step " << sa.step;
  }
  expect_equal(optimizer_state(a), optimizer_state(b));
}

TEST(Nonfinite, SkippedStepEqualsARunWithoutItsUpdate) {
  skipped_step_equals_run_without_it(tiny("gpt-tiny.yaml"));
}

TEST(Nonfinite, SkippedStepKeepsTheLossFreeRoutingBias) {
  skipped_step_equals_run_without_it(tiny("moe-tiny.yaml", {"model.moe.balance=loss_free"}));
}

TEST(Nonfinite, ConfigKeysParseAndValidate) {
  JobSpec d = tiny("gpt-tiny.yaml");
  EXPECT_EQ(d.train.on_nonfinite, "stop");
  EXPECT_EQ(d.train.max_skipped, 5);
  JobSpec s = tiny("gpt-tiny.yaml", {"train.on_nonfinite=skip", "train.max_skipped=2"});
  EXPECT_EQ(s.train.on_nonfinite, "skip");
  EXPECT_EQ(s.train.max_skipped, 2);
  JobSpec round = parse_job_spec(job_spec_to_yaml(s), WEFT_SOURCE_DIR);
  EXPECT_EQ(round.train.on_nonfinite, "skip");
  EXPECT_EQ(round.train.max_skipped, 2);
  try {
    tiny("gpt-tiny.yaml", {"train.on_nonfinite=ignore"});
    FAIL() << "accepted train.on_nonfinite: ignore";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.on_nonfinite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("stop|skip"), std::string::npos) << e.what();
  }
  try {
    tiny("gpt-tiny.yaml", {"train.max_skipped=0"});
    FAIL() << "accepted train.max_skipped: 0";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.max_skipped"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace weft::core
