// elastic.old_state: free_as_moved (issue 14: "release each source before allocating the
// next destination"). Without any in-memory snapshot, a survivor's old state still goes to
// the router as the only handles and is freed as it moves; the resize line says so and that
// no snapshot backs it, and the numbers stay one process's. (The default, keep_unless_backed,
// is LiveResize.Dp4ToDp2ByKillsThenDp3ByAJoin...: no snapshots, nothing freed as it moves.)
#include <gtest/gtest.h>

#include "tests/support/live_job.h"

namespace weft::test {
namespace {

using namespace live;

TEST(LiveResizeOldState, FreeAsMovedFreesTheSurvivorsStateWithoutASnapshotAndKeepsTheNumbers) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_old_state", "free");
  job.id = "live-old-state-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 120;
  const std::vector<std::string> layout = {"parallel.dp=auto", "parallel.zero=1"};
  job.sets = layout;
  job.sets.push_back("elastic.old_state=free_as_moved");
  const fs::path ref = reference_run(job.dir, job.steps, layout);
  job.start_in_order(2);
  ASSERT_TRUE(job.wait_steps(30)) << job.all_logs();
  const std::vector<pid_t> survivors = {children(job.pid(0)).at(0), children(job.pid(1)).at(0)};
  job.start();
  ASSERT_TRUE(job.wait_world(3, 10)) << phases_text(job.phases()) << job.all_logs();
  EXPECT_EQ(children(job.pid(0)), std::vector<pid_t>{survivors[0]}) << job.all_logs();
  EXPECT_EQ(children(job.pid(1)), std::vector<pid_t>{survivors[1]}) << job.all_logs();
  job.expect_exits({0, 1, 2});
  const std::string resize = job.only_resize_line();
  ASSERT_FALSE(resize.empty());
  EXPECT_NE(resize.find("world 2 -> 3"), std::string::npos) << resize;
  EXPECT_NE(resize.find("state from 2 holders through the router"), std::string::npos) << resize;
  EXPECT_NE(resize.find("rank 0 freed its old state as it moved (elastic.old_state: "
                            "free_as_moved; no snapshot of this step backs it)"),
            std::string::npos)
      << resize;
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
