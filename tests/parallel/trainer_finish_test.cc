// A step split at its update and finished locally (ParallelTrainer::finish_step): a rank
// whose statistics exchange failed while a peer's completed holds its reduced gradients and
// the step's norm, and where the rest of its step program needs no peer it completes the
// step with the statistics that peer got. What it then holds must be bit for bit what a
// whole step leaves; where the rest needs a peer (ZeRO-1's gather of the updated shards,
// loss_free's bias update) the trainer says it cannot and refuses.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "parallel/trainer.h"
#include "parallel/vps.h"
#include "tests/parallel/layout_harness.h"
#include "tests/parallel/trainer_data.h"
#include "tests/support/bitwise.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

using parallel::ParallelTrainer;
using parallel::RankLayout;
using parallel::StateSpace;

// Thrown by the test's before_update hook: the exchange completed, the update did not start
// (what a lost peer does to a rank whose piece of the exchange never came).
struct StopBeforeUpdate : std::runtime_error {
  StopBeforeUpdate() : std::runtime_error("stopped before the update (test)") {}
};

std::vector<core::Tensor> state_of(ParallelTrainer& t) {
  const StateSpace space = StateSpace::from_graph(t.graph(), t.moe_balance());
  std::vector<core::Tensor> out;
  for (const core::Tensor& x :
       t.state_tensors(space, parallel::layout_of(space, t.plan(), t.rank())))
    out.push_back(x.clone());
  return out;
}

// How many state tensors differ in a bit (0 expected), with the first one's name.
std::string state_diff(ParallelTrainer& t, const std::vector<core::Tensor>& a,
                       const std::vector<core::Tensor>& b) {
  const StateSpace space = StateSpace::from_graph(t.graph(), t.moe_balance());
  const RankLayout mine = parallel::layout_of(space, t.plan(), t.rank());
  if (a.size() != b.size()) return str(a.size(), " tensors against ", b.size());
  int differ = 0;
  std::string first;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i]) && differ++ == 0) first = space.at(mine.locals[i].state).name;
  return differ ? str(differ, " differ, the first ", first) : "";
}

// On `world` ranks: reference trainer R runs steps 0..2 whole. Trainer X runs step 0, then
// step 1 stops right before its update (after the exchange); when `local`, X finishes it
// with R's exchanged records of step 1 and must then hold R's state after step 1 bit for
// bit, and step 2 must give R's statistics and state. Statistics of another step are
// refused first, with nothing changed. When not `local`, X cannot finish and refuses to.
void expect_finish(const std::string& config, int world, std::vector<std::string> sets,
                   bool local) {
  const core::JobSpec spec = trainer_spec(config, std::move(sets));
  TrainData data(spec);
  const core::BatchFn batch = data.batch();
  constexpr int64_t kSplitAt = 1;
  const RunOptions ro = trainer_run_options();
  RunResult r = run_ranks(
      world,
      [&](RankContext& ctx) {
        std::vector<core::StepStats> ref;
        std::vector<double> ref_values;  // R's exchanged records of step kSplitAt
        std::vector<double> wrong_values;  // of step 0
        std::vector<core::Tensor> ref_split, ref_end;  // R's state after kSplitAt, at the end
        {
          RankWorld w = gloo_world(ctx, "r", std::chrono::milliseconds(30'000));
          ParallelTrainer t(spec, *w.comm);
          for (int64_t s = 0; s <= kSplitAt + 1; ++s) {
            ref.push_back(t.step(batch));
            if (s == 0) wrong_values = t.exchanged_values();
            if (s == kSplitAt) {
              ref_values = t.exchanged_values();
              ref_split = state_of(t);
            }
          }
          ref_end = state_of(t);
        }
        ASSERT_FALSE(ref_values.empty());
        RankWorld w = gloo_world(ctx, "x", std::chrono::milliseconds(30'000));
        ParallelTrainer x(spec, *w.comm);
        EXPECT_FALSE(x.can_finish_step()) << "before any step";
        expect_same_stats(x.step(batch), ref[0]);
        EXPECT_FALSE(x.can_finish_step()) << "after a whole step";
        const std::vector<core::Tensor> before = state_of(x);
        x.set_before_update([&] {
          if (x.current_step() == kSplitAt) throw StopBeforeUpdate();
        });
        EXPECT_THROW(x.step(batch), StopBeforeUpdate);
        EXPECT_FALSE(x.torn());
        EXPECT_EQ(x.current_step(), kSplitAt);
        EXPECT_EQ(state_diff(x, state_of(x), before), "") << "the stopped step wrote state";
        ASSERT_EQ(x.can_finish_step(), local);
        if (!local) {
          EXPECT_THROW(x.finish_step(ref_values), InternalError);
          EXPECT_EQ(x.current_step(), kSplitAt);
          return;
        }
        // Another step's records: refused (their norm is not the one this rank reduced).
        try {
          x.finish_step(wrong_values);
          ADD_FAILURE() << "finish_step took step 0's statistics for step 1";
        } catch (const InternalError& e) {
          EXPECT_NE(std::string(e.what()).find("not this step's"), std::string::npos) << e.what();
        }
        EXPECT_TRUE(x.can_finish_step());
        EXPECT_EQ(x.current_step(), kSplitAt);
        EXPECT_EQ(state_diff(x, state_of(x), before), "") << "a refused finish wrote state";

        expect_same_stats(x.finish_step(ref_values), ref[kSplitAt]);
        EXPECT_EQ(x.current_step(), kSplitAt + 1);
        EXPECT_FALSE(x.can_finish_step());
        ASSERT_TRUE(x.exchanged_stats().has_value());
        expect_same_stats(*x.exchanged_stats(), ref[kSplitAt]);
        EXPECT_EQ(state_diff(x, state_of(x), ref_split), "") << "after the finished step";
        EXPECT_EQ(state_diff(x, state_of(x), before).empty(), false) << "the update changed nothing";
        expect_same_stats(x.step(batch), ref[kSplitAt + 1]);
        EXPECT_EQ(state_diff(x, state_of(x), ref_end), "") << "after the next whole step";
      },
      ro);
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(TrainerFinish, Dp2) { expect_finish("gpt-layout.yaml", 2, {"parallel.dp=2"}, true); }

TEST(TrainerFinish, Tp2) {
  expect_finish("gpt-layout.yaml", 2, {"parallel.dp=1", "parallel.tp=2"}, true);
}

TEST(TrainerFinish, Pp2OneFOneB) {
  expect_finish("gpt-layout.yaml", 2,
                {"parallel.dp=1", "parallel.pp=2", "parallel.pipeline.schedule=1f1b"}, true);
}

TEST(TrainerFinish, Dp2Zero3) {
  expect_finish("gpt-layout.yaml", 2, {"parallel.dp=2", "parallel.zero=3"}, true);
}

TEST(TrainerFinish, MoeEp2) {
  expect_finish("moe-layout.yaml", 2, {"parallel.dp=1", "parallel.ep=2"}, true);
}

// The balance loss folded from the shares reduced mid-step (local by the update).
TEST(TrainerFinish, MoeEp2GlobalShares) {
  expect_finish("moe-layout.yaml", 2,
                {"model.moe.balance=aux_loss_global", "parallel.dp=1", "parallel.ep=2"}, true);
}

// ZeRO-1 gathers the updated shards after adamw: the rest of the step needs the peer.
TEST(TrainerFinish, Dp2Zero1CannotFinish) {
  expect_finish("gpt-layout.yaml", 2, {"parallel.dp=2", "parallel.zero=1"}, false);
}

// loss_free moves its bias from the world's load after the update: a sum over the world.
TEST(TrainerFinish, MoeLossFreeCannotFinish) {
  expect_finish("moe-layout.yaml", 2, {"model.moe.balance=loss_free", "parallel.dp=2"}, false);
}

}  // namespace
}  // namespace weft::test
