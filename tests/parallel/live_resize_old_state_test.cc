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
  for (int k = 0; k < 3; ++k) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  const std::vector<std::string> resizes = lines_with(job.text(0), "resize: epoch");
  ASSERT_EQ(resizes.size(), 1u) << job.all_logs();
  std::printf("[ says     ] %s\n", resizes[0].c_str());
  EXPECT_NE(resizes[0].find("world 2 -> 3"), std::string::npos) << resizes[0];
  EXPECT_NE(resizes[0].find("state from 2 holders through the router"), std::string::npos)
      << resizes[0];
  EXPECT_NE(resizes[0].find("rank 0 freed its old state as it moved (elastic.old_state: "
                            "free_as_moved; no snapshot of this step backs it)"),
            std::string::npos)
      << resizes[0];
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
