// A non-finite step on real ranks: a NaN that only one rank's pieces hold makes every rank
// drop the same step (the global norm carries it), every rank's parameters and moments stay
// as they were, and training goes on once the NaN is gone.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "comm/registry.h"
#include "core/data/dataset.h"
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

void drop_on_every_rank(const std::vector<std::string>& layout) {
  LayoutCase c{"gpt-layout.yaml", 2, layout, 3, 0};
  c.overrides.push_back("train.warmup_steps=0");
  core::JobSpec spec = layout_spec(c);
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  RunResult r = run_ranks(2, [&](RankContext& ctx) {
    RankWorld world = gloo_world(ctx, "nonfinite", std::chrono::milliseconds(30'000));
    parallel::ParallelTrainer pt(spec, *world.comm);
    auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
      data.fill_train(s, b0, n, x, y);
    };
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
  });
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(NonfiniteLayout, Dp2DropsTheStepOnEveryRank) { drop_on_every_rank({"parallel.dp=2"}); }
TEST(NonfiniteLayout, Pp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.pp=2"});
}
TEST(NonfiniteLayout, Tp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=1", "parallel.tp=2"});
}
// Open bug (h-nonfinite): under ZeRO 2 and 3 the dropped step leaves the state bitwise as it
// was, yet the next step's norm is still NaN: some per-step buffer of the sharded norm or
// gradient path seems to carry the NaN over. Disabled until found.
TEST(NonfiniteLayout, DISABLED_Zero2Dp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=2", "parallel.zero=2"});
}
TEST(NonfiniteLayout, DISABLED_Zero3Dp2DropsTheStepOnEveryRank) {
  drop_on_every_rank({"parallel.dp=2", "parallel.zero=3"});
}

}  // namespace
}  // namespace weft::test
