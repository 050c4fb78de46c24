// What an online resize reuses from one world's trainer in the next, in one process: the
// planning graph and the plan (planner::PlanCache), the gradient blocks the last trainer
// freed (memory::RecyclingAllocator).
// Every case trains bit for bit like a trainer that made everything itself.
#include <gtest/gtest.h>

#include <bit>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/registry.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "memory/recycling_allocator.h"
#include "parallel/router.h"
#include "parallel/trainer.h"
#include "parallel/vps.h"
#include "planner/plan_cache.h"
#include "tests/parallel/layout_harness.h"
#include "tests/parallel/trainer_data.h"
#include "tests/support/bitwise.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

using parallel::ParallelTrainer;
using parallel::StateInit;
using parallel::StateSpace;
using parallel::TrainerParts;

// Trainer R makes everything itself and runs 6 steps. Trainer X, built from a PlanCache's
// graph and plan with a RecyclingAllocator, runs 3, keeps views of its state and is
// destroyed; trainer Y (kDeferred) gets the cache's same plan object and the allocator,
// takes X's gradient blocks back, adopts X's state and runs steps 3..5: R's numbers.
void expect_resize_in_place(int world, const std::vector<std::string>& sets) {
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
          for (int s = 0; s < 6; ++s) ref.push_back(t.step(batch));
        }
        // Before what it serves; every block (small ones too) is kept for reuse.
        memory::RecyclingAllocator blocks(memory::default_host_allocator(), 1);
        planner::PlanCache plans(spec);
        const StateSpace space = StateSpace::from_graph(plans.graph()->graph);
        std::vector<core::Tensor> kept;
        parallel::RankLayout mine;
        {
          RankWorld w = gloo_world(ctx, "x", std::chrono::milliseconds(30'000));
          ParallelTrainer x(spec, *w.comm, StateInit::kSeed,
                            TrainerParts{plans.graph(), plans.plan(world), &blocks});
          EXPECT_EQ(&x.plan(), plans.plan(world).get());
          EXPECT_EQ(&x.graph(), &plans.graph()->graph);
          for (int s = 0; s < 3; ++s) expect_same_stats(x.step(batch), ref[size_t(s)]);
          mine = parallel::layout_of(space, x.plan(), x.rank());
          kept = x.state_tensors(space, mine);
        }
        const size_t freed = blocks.bytes_kept();
        EXPECT_GT(freed, 0u) << "X's gradients (and other non-state blocks) are kept";
        RankWorld w = gloo_world(ctx, "y", std::chrono::milliseconds(30'000));
        ParallelTrainer y(spec, *w.comm, StateInit::kDeferred,
                          TrainerParts{plans.graph(), plans.plan(world), &blocks});
        EXPECT_EQ(&y.plan(), plans.plan(world).get());
        EXPECT_EQ(plans.plans_made(), 1);
        EXPECT_GT(blocks.reused(), 0u);
        EXPECT_EQ(blocks.bytes_kept(), 0u) << "every block X freed is Y's again";
        y.adopt_state(space, mine, kept);
        for (int s = 3; s < 6; ++s) expect_same_stats(y.step(batch), ref[size_t(s)]);
      },
      ro);
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(TrainerParts, CachedPlanAndRecycledGradientsGiveTheSameNumbersOneRank) {
  expect_resize_in_place(1, {});
}

TEST(TrainerParts, CachedPlanAndRecycledGradientsGiveTheSameNumbersDp2Zero1) {
  expect_resize_in_place(2, {"parallel.dp=2", "parallel.zero=1"});
}

// The plan must be the world's: another size is refused before anything is built.
TEST(TrainerParts, APlanForAnotherWorldIsRefused) {
  const core::JobSpec spec = trainer_spec("gpt-layout.yaml", {});
  planner::PlanCache plans(spec);
  comm::CommOptions o;
  o.rank = 0, o.size = 1;
  auto world = comm::make_communicator(comm::BackendKind::kLoopback, o);
  EXPECT_THROW(
      ParallelTrainer(spec, *world, StateInit::kSeed, TrainerParts{nullptr, plans.plan(2)}),
      InternalError);
}

// A newcomer's destinations land in the blocks reserved for them ahead (the pages faulted
// in while it waited for the world): rank 0 holds a [2, 256Ki] f32 state whole and sends
// it to rank 1, whose destination comes from its RecyclingAllocator's reserved block.
TEST(TrainerParts, TransitionDestinationsComeFromTheBlocksReservedAhead) {
  core::Graph g;
  core::Value v;
  v.name = "w";
  v.shape = {2, int64_t(256) << 10};
  v.dtype = core::DType::kF32;
  v.role = core::Role::kParameter;
  v.persistent = true;
  g.add_value(v);
  const StateSpace space = StateSpace::from_graph(g);
  parallel::Layout a, b;
  a.ranks.resize(2), b.ranks.resize(2);
  a.hosts = b.hosts = {0, 0};
  for (auto [l, r] : {std::pair{&a, 0}, std::pair{&b, 1}}) {
    parallel::RankLayout& rl = l->ranks[size_t(r)];
    rl.locals.push_back(parallel::LocalTensor{0, v.shape, core::DType::kF32, -1});
    rl.boxes.push_back(parallel::StateBox{0, {0, 0}, v.shape, 0, {0, 0}});
  }
  const parallel::TransferPlan plan = parallel::transition(space, a, b);
  const size_t bytes = size_t(2) * (size_t(256) << 10) * 4;
  for (bool shm : {true, false}) {
    RunResult r = run_ranks(2, [&](RankContext& ctx) {
      RankWorld w = gloo_world(ctx, "dest", std::chrono::milliseconds(30'000));
      memory::RecyclingAllocator blocks;
      std::vector<core::Tensor> src;
      if (ctx.rank() == 0) {
        core::Tensor t = core::Tensor::empty(v.shape, core::DType::kF32);
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(i % 1000);
        src.push_back(t);
      } else {
        blocks.reserve({bytes});
        EXPECT_EQ(blocks.bytes_kept(), bytes);
      }
      parallel::TransitionOptions o;
      o.shared_memory = shm;
      o.destinations = &blocks;
      std::vector<core::Tensor> out =
          parallel::run_transition(plan, a, b, ctx.rank(), src, *w.comm, o);
      if (ctx.rank() == 1) {
        ASSERT_EQ(out.size(), 1u);
        EXPECT_EQ(blocks.reused(), 1u) << "the reserved block, not a new one";
        EXPECT_EQ(blocks.bytes_kept(), 0u);
        EXPECT_EQ(out[0].data<float>()[0], 0.f);
        EXPECT_EQ(out[0].data<float>()[out[0].numel() - 1], float((out[0].numel() - 1) % 1000));
      }
    });
    EXPECT_TRUE(r.ok()) << (shm ? "shared memory: " : "communicator: ") << r.summary();
  }
}

}  // namespace
}  // namespace weft::test
