// A save by four real processes (dp2 x tp2 over Gloo on 127.0.0.1), each writing its own
// shard, committed once by rank 0; the single-process trainer then loads it bit for bit.
#include <gtest/gtest.h>

#include "comm/registry.h"
#include "planner/planner.h"
#include "tests/checkpoint/ckpt_util.h"
#include "tests/support/multiprocess.h"

namespace weft::checkpoint {
namespace {

using test_util::TempDir;

TEST(CheckpointRanks, FourProcessesSaveOneCheckpointThatLoadsWhole) {
  TempDir dir;
  core::JobSpec spec = test_util::tiny_job();
  spec.train.micro_batch = 2;
  spec.parallel.dp = 2, spec.parallel.tp = 2;
  core::Trainer t(spec);
  t.set_current_step(7);
  const auto whole = test_util::whole_state(t);
  parallel::StateSpace space =
      parallel::StateSpace::from_graph(planner::build_planning_graph(spec).graph);
  planner::PlanOptions o;
  o.simulate = false;
  parallel::Layout layout = parallel::layout_of(space, planner::make_plan(spec, 4, o));

  test::RunResult result = test::run_ranks(4, [&](test::RankContext& ctx) {
    auto store = ctx.store();
    comm::CommOptions co;
    co.rank = ctx.rank(), co.size = ctx.world(), co.store = store.get(), co.prefix = "ckpt";
    auto comm = comm::make_communicator(comm::BackendKind::kGloo, co);
    std::vector<core::Tensor> mine = test_util::slice_for(space, layout, ctx.rank(), whole);
    std::string step = save_checkpoint_ranks(dir.str(), CheckpointInfo{&spec, 7, "dp2 tp2"}, space,
                                             layout, ctx.rank(), mine, 2, *comm);
    EXPECT_NE(step.find("step-00000007"), std::string::npos);
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(step) / kMetadataFile))
        << "committed on return";
  });
  ASSERT_TRUE(result.ok()) << result.summary();

  std::string step = resolve_checkpoint(dir.str(), "x");
  Metadata m = read_metadata(step, "x");
  EXPECT_EQ(m.shards.size(), 4u) << "replicated boxes are spread over the data-parallel copies";
  EXPECT_GT(verify_checkpoint(step, m, "x"), 0);
  core::JobSpec single = spec;
  single.parallel.dp = 0, single.parallel.tp = 1;
  core::Trainer u(single);
  TrainerCheckpoints ckpt(single, u, dir.str());
  EXPECT_EQ(u.current_step(), 7);
  auto got = test_util::whole_state(u);
  for (auto& [name, x] : whole) EXPECT_TRUE(test_util::same_bytes(x, got.at(name))) << name;
}

}  // namespace
}  // namespace weft::checkpoint
