// Expert balancing over the global batch (model.moe.balance aux_loss_global and loss_free):
// the shared state, the routing kernels' bias and shares, and the single-process trainer.
#include "core/graph/moe_balance.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/config/job_spec.h"
#include "core/cpu/kernels.h"
#include "core/cpu/moe.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"

namespace weft::core {
namespace {

// ---- the state --------------------------------------------------------------------------

TEST(MoeBalance, SharesAreTheGlobalCountsWhateverTheReplication) {
  MoeBalance b(MoeBalance::Mode::kGlobalAux, {1, 3}, 4, 0.0);
  b.begin_step();
  const double c1[4] = {3, 1, 0, 4}, p1[4] = {1.5, 0.5, 0.5, 1.5};
  const double c2[4] = {1, 1, 2, 0}, p2[4] = {0.5, 0.5, 0.5, 0.5};
  b.record(1, c1, p1, 4);
  b.record(1, c2, p2, 2);
  b.record(3, c2, p2, 2);
  EXPECT_EQ(b.shares(1), nullptr);  // not before the step's routings are all in
  // The same routings counted by two replicas (tensor-parallel lanes) sum to twice the table.
  std::vector<double> twice = b.pack();
  for (double& v : twice) v *= 2;
  MoeBalance r = b;
  r.absorb(twice);
  b.freeze_shares();
  r.freeze_shares();
  for (int layer : {1, 3})
    for (int e = 0; e < 4; ++e) EXPECT_EQ(b.shares(layer)[e], r.shares(layer)[e]);
  EXPECT_DOUBLE_EQ(b.shares(1)[0], 4.0 / 12.0);
  EXPECT_DOUBLE_EQ(b.shares(1)[2], 2.0 / 12.0);
  // E sum_e f_e P_e with P the mean probability over all 6 tokens, plus block 3's.
  double l1 = 4 * (4.0 / 12 * 2.0 / 6 + 2.0 / 12 * 1.0 / 6 + 2.0 / 12 * 1.0 / 6 + 4.0 / 12 * 2.0 / 6);
  double l3 = 4 * (0.25 * 0.25 + 0.25 * 0.25 + 0.5 * 0.25);
  EXPECT_NEAR(b.global_aux_loss(), l1 + l3, 1e-15);
  EXPECT_NEAR(r.global_aux_loss(), l1 + l3, 1e-15);
  EXPECT_THROW(b.record(1, c1, p1, 4), InternalError);  // a forward after the shares froze
}

TEST(MoeBalance, LossFreeBiasMovesAgainstTheLoad) {
  MoeBalance b(MoeBalance::Mode::kLossFree, {0}, 4, 0.01);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(b.bias(0)[e], 0.0f);
  b.begin_step();
  const double c[4] = {5, 3, 3, 1}, p[4] = {0, 0, 0, 0};  // mean 3
  b.record(0, c, p, 6);
  b.update_bias();
  EXPECT_FLOAT_EQ(b.bias(0)[0], -0.01f);  // overloaded: less attractive
  EXPECT_FLOAT_EQ(b.bias(0)[1], 0.0f);    // at the mean: unchanged
  EXPECT_FLOAT_EQ(b.bias(0)[3], 0.01f);   // underloaded: more attractive
  EXPECT_EQ(&b.bias_tensor(0).data<float>()[0], b.bias(0));
  EXPECT_EQ(MoeBalance::bias_name(5), "moe.bias:h.5");
}

TEST(MoeBalance, ForModelFollowsTheBalanceKey) {
  JobSpec s = load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/moe-layout.yaml", {});
  EXPECT_EQ(MoeBalance::for_model(s.model), nullptr);  // aux_loss: nothing shared
  s.model.moe.balance = "loss_free";
  s.model.moe.every = 2;
  auto b = MoeBalance::for_model(s.model);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->mode(), MoeBalance::Mode::kLossFree);
  EXPECT_EQ(b->layers(), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_THROW(b->bias(0), InternalError);  // block 0 has a dense MLP
}

// ---- kernels ----------------------------------------------------------------------------

TEST(MoeRouting, BiasChangesTheChoiceNotTheWeights) {
  const float probs[4] = {0.4f, 0.3f, 0.2f, 0.1f};
  cpu::MoeTopK plain = cpu::moe_top_k(probs, 1, 4, 2);
  EXPECT_EQ(plain.expert, (std::vector<int32_t>{0, 1}));
  const float bias[4] = {0.f, -0.25f, 0.f, 0.25f};  // scores 0.4 0.05 0.2 0.35
  cpu::MoeTopK biased = cpu::moe_top_k(probs, 1, 4, 2, bias);
  EXPECT_EQ(biased.expert, (std::vector<int32_t>{0, 3}));
  EXPECT_NEAR(biased.weight[0], 0.4 / 0.5, 1e-7);  // renormalised probabilities, no bias
  EXPECT_NEAR(biased.weight[1], 0.1 / 0.5, 1e-7);
}

TEST(MoeRouting, GivenSharesReplaceTheLocalOnesInTheBalanceGradient) {
  const int64_t N = 3, C = 2, E = 3, k = 1, A = N * k;
  std::vector<double> y = {0.1, -0.2, 0.3, 0.5, -0.4, 0.2}, router = {0.3, 0.1, -0.2, 0.4, 0.05, -0.3};
  std::vector<double> logits(N * E), probs(N * E), xe(A * C);
  std::vector<int32_t> route(A * 2);
  std::vector<double> counts(E), sums(E);
  cpu::moe_route_forward<double>(y.data(), router.data(), logits.data(), probs.data(), route.data(),
                                 xe.data(), N, C, E, k, 0.0, nullptr, counts.data(), sums.data());
  double total = 0;
  for (double c : counts) total += c;
  EXPECT_EQ(total, double(A));
  std::vector<double> local(E);
  for (int64_t e = 0; e < E; ++e) local[size_t(e)] = counts[size_t(e)] / total;
  std::vector<double> dout(N * C, 0.0), ye(A * C, 0.0), dye(A * C), d_own(N * E), d_given(N * E),
      d_other(N * E);
  cpu::moe_combine_backward<double>(dout.data(), ye.data(), route.data(), probs.data(), dye.data(),
                                    d_own.data(), 1.0, N, C, E, k);
  cpu::moe_combine_backward<double>(dout.data(), ye.data(), route.data(), probs.data(), dye.data(),
                                    d_given.data(), 1.0, N, C, E, k, nullptr, local.data());
  const double other[3] = {0.5, 0.25, 0.25};
  cpu::moe_combine_backward<double>(dout.data(), ye.data(), route.data(), probs.data(), dye.data(),
                                    d_other.data(), 1.0, N, C, E, k, nullptr, other);
  for (int64_t i = 0; i < N * E; ++i) {
    EXPECT_NEAR(d_own[size_t(i)], d_given[size_t(i)], 1e-15);
    // With dout = 0 only the balance term is left: E f_e / N.
    EXPECT_NEAR(d_other[size_t(i)], 3 * other[i % E] / 3, 1e-15);
  }
}

// ---- the single-process trainer -------------------------------------------------------

struct TrainRun {
  std::vector<StepStats> steps;
  NamedTensors weights;
  std::vector<float> bias;  // block 0's loss_free bias after the run
};

TrainRun train(std::vector<std::string> sets, int steps = 3) {
  sets.insert(sets.end(), {"train.threads=1", "train.eval_every=0", "train.warmup_steps=1",
                           "train.steps=" + std::to_string(steps)});
  JobSpec spec = load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/moe-layout.yaml", sets);
  cpu::set_num_threads(1);
  data::TokenDataset data = data::TokenDataset::load(spec);
  Trainer t(spec);
  TrainRun r;
  for (int s = 0; s < steps; ++s)
    r.steps.push_back(t.step([&](int64_t st, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
      data.fill_train(st, b0, n, x, y);
    }));
  r.weights = t.weights();
  if (t.moe_balance() && t.moe_balance()->mode() == MoeBalance::Mode::kLossFree)
    r.bias = t.moe_balance()->bias_tensor(0).to_vector<float>();
  return r;
}

double max_rel(const TrainRun& a, const TrainRun& b, double StepStats::*field) {
  double m = 0;
  for (size_t i = 0; i < a.steps.size(); ++i)
    m = std::max(m, std::fabs(a.steps[i].*field - b.steps[i].*field) / std::fabs(b.steps[i].*field));
  return m;
}

TEST(MoeBalanceTrainer, GlobalSharesDoNotDependOnTheMicroBatching) {
  // aux_loss_global's objective is that of the global batch, so 4 micro-batches of 4 train
  // like one of 16 up to rounding; the per-micro-batch aux_loss does not.
  TrainRun g4 = train({"model.moe.balance=aux_loss_global", "train.micro_batch=4"});
  TrainRun g16 = train({"model.moe.balance=aux_loss_global", "train.micro_batch=16"});
  TrainRun l4 = train({"model.moe.balance=aux_loss", "train.micro_batch=4"});
  TrainRun l16 = train({"model.moe.balance=aux_loss", "train.micro_batch=16"});
  EXPECT_LE(max_rel(g4, g16, &StepStats::loss), 1e-6);
  EXPECT_LE(max_rel(g4, g16, &StepStats::aux_loss), 1e-6);
  EXPECT_LE(max_rel(g4, g16, &StepStats::grad_norm), 1e-5);
  EXPECT_GE(max_rel(l4, l16, &StepStats::aux_loss), 1e-4);  // the contrast the test rests on
  // One micro-batch is the whole global batch: global and per-micro-batch agree exactly.
  for (size_t i = 0; i < g16.steps.size(); ++i) {
    EXPECT_EQ(g16.steps[i].loss, l16.steps[i].loss);
    EXPECT_EQ(g16.steps[i].grad_norm, l16.steps[i].grad_norm);
    EXPECT_NEAR(g16.steps[i].aux_loss, l16.steps[i].aux_loss, 1e-7 * l16.steps[i].aux_loss);  // f32 output
  }
}

TEST(MoeBalanceTrainer, LossFreeTrainsWithoutABalanceLossAndMovesItsBias) {
  TrainRun free = train({"model.moe.balance=loss_free", "model.moe.bias_update_rate=0"});
  TrainRun none = train({"model.moe.balance=aux_loss", "model.moe.aux_coef=0"});
  for (size_t i = 0; i < free.steps.size(); ++i) {
    EXPECT_EQ(free.steps[i].loss, none.steps[i].loss);  // a zero bias routes like top-k
    EXPECT_EQ(free.steps[i].grad_norm, none.steps[i].grad_norm);
    EXPECT_EQ(free.steps[i].aux_loss, 0.0);
  }
  TrainRun moving = train({"model.moe.balance=loss_free", "model.moe.bias_update_rate=0.01"});
  ASSERT_EQ(moving.bias.size(), 4u);
  double moved = 0;
  for (float b : moving.bias) moved += std::fabs(b);
  EXPECT_GT(moved, 0.0);
  for (float b : moving.bias)  // three updates of +-0.01 (or 0 at the mean)
    EXPECT_LE(std::fabs(b), 0.03f + 1e-6f);
  // The bias routes: after two updates the third step's loss is not the unbiased one.
  EXPECT_NE(moving.steps.back().loss, free.steps.back().loss);
}

TEST(MoeBalanceTrainer, ConfigRejectsANegativeRate) {
  EXPECT_THROW(load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/moe-layout.yaml",
                             {"model.moe.bias_update_rate=-1"}),
               ConfigError);
}

}  // namespace
}  // namespace weft::core
