// A non-finite step on real ranks: a NaN that only one rank's pieces hold makes every rank
// drop the same step (the global norm carries it), every rank's parameters and moments stay
// as they were, and training goes on once the NaN is gone.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "comm/registry.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "parallel/trainer.h"
#include "tests/parallel/layout_harness.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

// Clones of this rank's parameter and optimizer-moment pieces, by table id.
std::map<int, core::Tensor> local_state(parallel::ParallelTrainer& pt) {
  std::map<int, core::Tensor> out;
  parallel::TensorTable& t = pt.executor().tensors();
  for (size_t i = 0; i < t.size(); ++i) {
    const planner::TensorDesc& d = t.desc(int(i));
    if (!d.persistent || d.alias_of >= 0 || d.value < 0 || !t.live(int(i))) continue;
    core::Role r = pt.graph().value(d.value).role;
    if (r == core::Role::kParameter || r == core::Role::kOptimizerState)
      out[int(i)] = t.read(int(i)).clone();
  }
  return out;
}

void expect_same(const std::map<int, core::Tensor>& a, const std::map<int, core::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, t] : a)
    ASSERT_EQ(t.to_vector<float>(), b.at(id).to_vector<float>()) << "table tensor " << id;
}

// The step after the dropped one, on one process: step 0, then step 2 as if step 1 had never
// run (a dropped step changes no state but the step counter). Its loss and gradient norm are
// what every layout must produce after the drop: a buffer that carried anything of the
// dropped step over (a NaN, or finite stale sums) shows here.
core::StepStats step_after_drop(const core::JobSpec& spec, const core::BatchFn& batch) {
  core::JobSpec single = spec;
  single.parallel = core::ParallelSpec();
  core::Trainer t(single);
  t.step(batch);
  t.set_current_step(2);
  return t.step(batch);
}

void drop_on_every_rank(const std::vector<std::string>& layout,
                        const std::string& config = "gpt-layout.yaml", Tolerance tol = kRegroup) {
  LayoutCase c{config, 2, layout, 3, tol};
  c.overrides.push_back("train.warmup_steps=0");
  core::JobSpec spec = layout_spec(c);
  core::cpu::set_num_threads(1);  // no OpenMP threads in the parent we fork from
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  const core::StepStats ref = step_after_drop(spec, batch);
  ASSERT_TRUE(ref.applied);
  RunResult r = run_ranks(2, [&](RankContext& ctx) {
    RankWorld world = gloo_world(ctx, "nonfinite", std::chrono::milliseconds(30'000));
    parallel::ParallelTrainer pt(spec, *world.comm);
    ASSERT_TRUE(pt.step(batch).applied);
    std::map<int, core::Tensor> before = local_state(pt);
    // Rank 1 alone poisons one element of its first parameter piece for step 1.
    float* poisoned = nullptr;
    float kept = 0;
    if (ctx.rank() == 1) {
      for (const auto& [id, t] : before)
        if (pt.graph().value(pt.executor().tensors().desc(id).value).role ==
            core::Role::kParameter) {
          poisoned = pt.executor().tensors().read(id).data<float>();
          break;
        }
      ASSERT_NE(poisoned, nullptr);
      kept = poisoned[0];
      poisoned[0] = std::numeric_limits<float>::quiet_NaN();
    }
    core::StepStats st = pt.step(batch);
    EXPECT_FALSE(st.applied);
    EXPECT_FALSE(std::isfinite(st.grad_norm));
    EXPECT_FALSE(std::isfinite(pt.executor().last_grad_norm()));
    EXPECT_EQ(pt.current_step(), 2);
    // The scan names a parameter on every rank alike (collective).
    EXPECT_FALSE(pt.first_nonfinite_gradient().empty());
    if (poisoned) poisoned[0] = kept;
    expect_same(local_state(pt), before);
    core::StepStats next = pt.step(batch);
    EXPECT_TRUE(next.applied);
    EXPECT_TRUE(std::isfinite(next.loss) && std::isfinite(next.grad_norm));
    EXPECT_NEAR(next.loss, ref.loss, tol.scalars * std::fabs(ref.loss));
    EXPECT_NEAR(next.grad_norm, ref.grad_norm, tol.scalars * std::fabs(ref.grad_norm));
    EXPECT_NEAR(next.aux_loss, ref.aux_loss, tol.scalars * std::fabs(ref.aux_loss));
  });
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(NonfiniteLayout, Dp2DropsTheStepOnEveryRank) { drop_on_every_rank({"parallel.dp=2"}); }
TEST(NonfiniteLayout, Pp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.pp=2"});
}
TEST(NonfiniteLayout, Tp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.tp=2"}, "gpt-layout.yaml", kSplit);
}
TEST(NonfiniteLayout, Zero1Dp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=2", "parallel.zero=1"});
}
// ZeRO-2/3 reduce-scatter each micro-batch's gradients during its backward, before the next
// micro-batch's forward: the fold once read the previous step's loss of that next
// micro-batch there (kept results outlive their step), so a dropped step dropped the next.
TEST(NonfiniteLayout, Zero2Dp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=2", "parallel.zero=2"});
}
TEST(NonfiniteLayout, Zero3Dp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=2", "parallel.zero=3"});
}
TEST(NonfiniteLayout, InterleavedPp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=interleaved",
                      "parallel.pipeline.virtual_stages=2"});
}
TEST(NonfiniteLayout, Ep2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.ep=2"}, "moe-layout.yaml");
}
TEST(NonfiniteLayout, Ep2Zero2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.ep=2", "parallel.zero=2"}, "moe-layout.yaml");
}
TEST(NonfiniteLayout, Ep2LossFreeDropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.ep=2", "model.moe.balance=loss_free"},
                     "moe-layout.yaml");
}
TEST(NonfiniteLayout, Ep2GlobalAuxDropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.ep=2", "model.moe.balance=aux_loss_global"},
                     "moe-layout.yaml");
}

}  // namespace
}  // namespace weft::test
