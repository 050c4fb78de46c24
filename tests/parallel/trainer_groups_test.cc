// Process groups given to a trainer (TrainerParts::groups): an online resize splits the next
// world's groups ahead, with its communicator, while the old world ends its step
// (launch/epoch_world.h). A trainer on groups split before it was built trains bit for bit
// like one that splits its own; groups that do not fit its plan, or were split over another
// communicator, are refused and split anew, with the same numbers.
#include <gtest/gtest.h>

#include <bit>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "parallel/process_groups.h"
#include "parallel/trainer.h"
#include "planner/plan_cache.h"
#include "planner/planner.h"
#include "tests/parallel/layout_harness.h"
#include "tests/parallel/trainer_data.h"
#include "tests/support/bitwise.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

using parallel::ParallelTrainer;
using parallel::ProcessGroups;
using parallel::StateInit;
using parallel::TrainerParts;

// How the groups given to the trainer were made.
enum class Given {
  kForItsPlan,        // for its plan, over its world: taken
  kForAnotherPlan,    // for `other`'s plan over its world: refused, split anew
  kOverAnotherWorld,  // for its plan over another communicator of the same ranks: refused
};

// Four ranks under `sets`: trainer R splits its own groups and runs 4 steps; trainer G, in a
// world of its own, gets groups made as `given` says before it is built and runs the same 4
// steps: R's numbers, bit for bit.
void expect_given_groups(const std::vector<std::string>& sets, Given given,
                         const std::vector<std::string>& other = {}) {
  const int world = 4;
  const core::JobSpec spec = trainer_spec("gpt-layout.yaml", sets);
  TrainData data(spec);
  const core::BatchFn batch = data.batch();
  const RunOptions ro = trainer_run_options();
  RunResult r = run_ranks(
      world,
      [&](RankContext& ctx) {
        std::vector<core::StepStats> ref;
        {
          RankWorld w = gloo_world(ctx, "r", std::chrono::milliseconds(30'000));
          ParallelTrainer t(spec, *w.comm);
          EXPECT_FALSE(t.groups_given());
          for (int s = 0; s < 4; ++s) ref.push_back(t.step(batch));
        }
        planner::PlanCache plans(spec);
        const std::shared_ptr<const planner::Plan> plan = plans.plan(world);
        RankWorld w = gloo_world(ctx, "g", std::chrono::milliseconds(30'000));
        RankWorld elsewhere;  // another communicator over the same ranks
        if (given == Given::kOverAnotherWorld)
          elsewhere = gloo_world(ctx, "e", std::chrono::milliseconds(30'000));
        std::unique_ptr<ProcessGroups> groups;
        int splits = 0;
        if (given == Given::kForItsPlan) {
          groups = std::make_unique<ProcessGroups>(*w.comm, *plan);
        } else if (given == Given::kForAnotherPlan) {
          const planner::Plan p = planner::make_plan(trainer_spec("gpt-layout.yaml", other), world);
          groups = std::make_unique<ProcessGroups>(*w.comm, p);
        } else {
          groups = std::make_unique<ProcessGroups>(*elsewhere.comm, *plan);
        }
        splits = groups->splits();
        EXPECT_GT(splits, 0) << "a layout whose groups need splits";
        EXPECT_EQ(groups->fits(*w.comm, *plan), given == Given::kForItsPlan);
        ParallelTrainer g(spec, *w.comm, StateInit::kSeed,
                          TrainerParts{plans.graph(), plan, nullptr, std::move(groups)});
        EXPECT_EQ(g.groups_given(), given == Given::kForItsPlan);
        if (given == Given::kForItsPlan) {
          EXPECT_EQ(g.groups().splits(), splits);
        }
        for (int s = 0; s < 4; ++s) expect_same_stats(g.step(batch), ref[size_t(s)]);
      },
      ro);
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(TrainerGroups, GroupsSplitAheadTrainLikeTheTrainersOwnTp2Dp2) {
  expect_given_groups({"parallel.dp=2", "parallel.tp=2"}, Given::kForItsPlan);
}

TEST(TrainerGroups, GroupsSplitAheadTrainLikeTheTrainersOwnPp2Dp2) {
  expect_given_groups({"parallel.dp=2", "parallel.pp=2"}, Given::kForItsPlan);
}

// Groups of a pp2 x dp2 plan given to a tp2 x dp2 trainer: other groups, refused.
TEST(TrainerGroups, GroupsOfAnotherPlanAreRefusedAndSplitAnew) {
  expect_given_groups({"parallel.dp=2", "parallel.tp=2"}, Given::kForAnotherPlan,
                      {"parallel.dp=2", "parallel.pp=2"});
}

TEST(TrainerGroups, GroupsSplitOverAnotherCommunicatorAreRefusedAndSplitAnew) {
  expect_given_groups({"parallel.dp=2", "parallel.tp=2"}, Given::kOverAnotherWorld);
}

}  // namespace
}  // namespace weft::test
