// A member lost during a step's statistics exchange under tp2 x dp2, with no snapshots and no
// checkpoint: the survivors are one TP pair, and the exchange reached one of them (it ran its
// update: step s+1) and not the other (step s). Neither step is covered by the survivors
// alone; the rank behind finishes step s itself with the statistics of the rank ahead (it
// holds its reduced gradients and the norm), so the new world resumes at step s+1 through
// the router instead of starting over. WEFT_TEST_SPLIT_EXCHANGE makes the split
// reproducible: right after step s's exchange returned, a rank of the other node SIGKILLs
// itself and rank 1 fails as if its piece never came. Until the entry's roll forward the rank
// behind still holds that step's trainer, its gradients with it: the next world's reserve,
// started as the world ends, counts them (launch/live_resize_prefault.h's bound).
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/live_job.h"

namespace weft::test {
namespace {

using namespace live;  // NOLINT: the harness of this file

TEST(LiveResizeRoll, Tp2Dp2RankBehindFinishesTheStepOfAMemberLostInTheExchange) {
  constexpr int kSplitAt = 20, kSteps = 60;
  LiveJob job;
  job.dir = agent_test_dir("live_roll", "tp2dp2");
  job.id = "live-roll-tp2dp2";
  job.steps = kSteps;
  job.nproc = 2;
  job.nnodes = "1:2";
  // As LiveResize.Tp2Dp2...: 1 or 2 micro-batches per replica keep a step near 0.1 s.
  const std::vector<std::string> sets = {"train.micro_batch=12"};
  job.sets = sets;
  job.sets.insert(job.sets.end(), {"parallel.tp=2", "parallel.dp=auto"});
  // Rank 2 (the other node's first worker) dies in step 20's exchange; rank 1 (the TP peer
  // of rank 0) falls behind.
  job.env = {"WEFT_TEST_SPLIT_EXCHANGE=" + std::to_string(kSplitAt) + ":2:1",
             "WEFT_LOG_LEVEL=debug", "WEFT_LOG_SUBSYS=resize"};
  const fs::path ref = reference_run(job.dir, kSteps, sets, job.config);
  job.start_in_order(2);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(job.wait_steps(1)) << job.all_logs();
  const std::vector<pid_t> survivors = children(job.pid(0));
  ASSERT_EQ(survivors.size(), 2u) << job.all_logs();
  ASSERT_LT(job.rows().size(), size_t(kSplitAt)) << "the split came before the PIDs were read";
  ASSERT_TRUE(job.wait_world(2, 10)) << phases_text(job.phases()) << job.all_logs();
  // The node whose worker died leaves the job (no restarts left); the survivors train on in
  // their own processes.
  EXPECT_EQ(job.wait(1), std::optional<int>(1)) << job.all_logs();
  EXPECT_EQ(children(job.pid(0)), survivors) << job.all_logs();
  EXPECT_EQ(job.wait(0), std::optional<int>(0)) << job.all_logs();
  expect_phases(job.phases(), {4, 2});
  // Every step once, in order, within the TP tolerance of one process's run: no step redone.
  expect_losses_by_step(ref, job.metrics(), 1e-4);
  // The resize line, not the debug lines' "DEBUG resize: epoch 1 entry: ...".
  const std::string line = job.only_line(0, "] resize: epoch");
  EXPECT_NE(line.find("world 4 -> 2 (dp 1 x tp 2 x pp 1 x ep 1) at step " +
                      std::to_string(kSplitAt + 1)),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("state from 2 holders through the router"), std::string::npos) << line;
  EXPECT_NE(line.find("1 rank behind (the member died during the statistics exchange) rolled "
                      "forward to step " +
                      std::to_string(kSplitAt + 1)),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("steps back"), std::string::npos) << line;
  // Only the rank behind holds gradients beside the reserve (rank 0 ran its update); both
  // are on node 0.
  const std::string counted =
      ": the reserve for a world of 2 starts beside the trainer that still holds its "
      "gradients: up to ";
  const std::vector<std::string> behind = job.lines_with(0, "rank 1" + counted);
  ASSERT_EQ(behind.size(), 1u) << job.text(0);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(behind[0], m, std::regex(R"(\(the ([0-9.e+-]+) MiB of gradients)")))
      << behind[0];
  EXPECT_GT(std::stod(m[1]), 0) << behind[0];
  EXPECT_TRUE(job.lines_with(0, "rank 0" + counted).empty()) << job.text(0);
  if (!HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
