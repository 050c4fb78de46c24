// elastic.old_state: free_as_moved, the default (issue 14: "release each source before
// allocating the next destination"). Without any in-memory snapshot, a survivor's old state
// goes to the router as the only handles and is freed as it moves; the resize line says so,
// and the numbers stay one process's. A second change that stops the move midway finds the
// state of the same step in the pieces of both layouts the ranks hold then. (keep_unless_backed
// is LiveResize.Dp4ToDp2ByKillsThenDp3ByAJoin...: no snapshots, nothing freed as it moves.)
#include <gtest/gtest.h>

#include "tests/support/live_job.h"

namespace weft::test {
namespace {

using namespace live;

TEST(LiveResizeOldState, TheDefaultFreesTheSurvivorsStateWithoutASnapshotAndKeepsTheNumbers) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize_old_state", "free");
  job.id = "live-old-state-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.steps = 120;
  const std::vector<std::string> layout = {"parallel.dp=auto", "parallel.zero=1"};
  job.sets = layout;  // elastic.old_state: free_as_moved by default
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

// dp2 ZeRO-1 on up to four loopback nodes, 300 steps, whose move into epoch 2 stops at
// `stall` (WEFT_TEST_STALL_MOVE=2:<stall>) with a router budget small enough for many waves.
void stopped_join(LiveJob& job, const std::string& name, const std::string& stall) {
  job.dir = agent_test_dir("live_resize_old_state", name);
  job.id = "live-" + name + "-" + std::to_string(::getpid());
  job.nnodes = "2:4";
  // Long enough that the old world still trains when the join is admitted (two heartbeat
  // intervals after the third agent starts, at step 30 or later): with 120 steps an idle
  // machine (14 ms a step) ended the job before it, in one suite run of three.
  job.steps = 300;
  job.sets = {"parallel.dp=auto", "parallel.zero=1"};
  job.env = {"WEFT_TEST_STALL_MOVE=2:" + stall, "WEFT_ROUTER_BUDGET_BYTES=65536",
             "WEFT_LOG_LEVEL=debug", "WEFT_LOG_SUBSYS=resize"};
}

// The world of four's one resize line (the debug lines of the resize subsystem say "resize:
// epoch" too): epoch 1 -> 3 at the step the stopped move held, from the pieces of both
// layouts, no step redone; one process's losses. Removes the job's folder when all held.
void expect_resumed_from_pieces(const LiveJob& job, size_t held_step, const fs::path& ref) {
  const std::vector<std::string> lines = job.lines_with(0, "] resize: epoch");
  ASSERT_EQ(lines.size(), 1u) << job.text(0);
  const std::string& resize = lines[0];
  std::printf("[ says     ] %s\n", resize.c_str());
  EXPECT_NE(resize.find("epoch 1 -> 3, world 2 -> 4"), std::string::npos) << resize;
  EXPECT_NE(resize.find("at step " + std::to_string(held_step) + ":"), std::string::npos) << resize;
  EXPECT_NE(resize.find("a move that this epoch stopped midway left the state in pieces of the "
                        "old and the new layout, of this step"),
            std::string::npos)
      << resize;
  EXPECT_EQ(resize.find("steps back"), std::string::npos) << resize;
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// dp2 ZeRO-1 grows to dp3 by a join, no snapshots; the move stops at half of each rank's bytes
// (WEFT_TEST_STALL_MOVE, with a router budget small enough for many waves; the first rank to
// get there holds up the others) until a fourth node joins. Each rank then holds the old layout's tensors it had not freed and the new layout's
// that had arrived (whole, or in part with its arrived boxes); the world of four takes the state of that same step from those
// pieces: no step redone, every worker kept (the survivors and the first newcomer), one
// process's losses.
TEST(LiveResizeOldState, AMoveStoppedByASecondJoinResumesFromThePiecesOfBothLayouts) {
  LiveJob job;
  stopped_join(job, "stopped", "50");
  const std::vector<std::string> layout = job.sets;
  const fs::path ref = reference_run(job.dir, job.steps, layout);
  job.start_in_order(2);
  ASSERT_TRUE(job.wait_steps(30)) << job.all_logs();
  const std::vector<pid_t> survivors = {children(job.pid(0)).at(0), children(job.pid(1)).at(0)};
  job.start();  // epoch 2: world 3
  // The first rank to stop holds up the others (they wait on it), so one line is enough.
  ASSERT_TRUE(job.wait_line_anywhere("the move stops after")) << job.all_logs();
  // Nobody trains while the move stands still: the step the next world must resume at.
  const size_t held_step = job.rows().size();
  const std::vector<pid_t> newcomer = children(job.pid(2));
  job.start();  // epoch 3: world 4
  // Its first line only: under load the old world may train on close to the job's end
  // before the joins are formed (CI saw the world of four at step 114 of 120: 6 lines).
  ASSERT_TRUE(job.wait_world(4)) << phases_text(job.phases()) << job.all_logs();
  EXPECT_EQ(children(job.pid(0)), std::vector<pid_t>{survivors[0]}) << job.all_logs();
  EXPECT_EQ(children(job.pid(1)), std::vector<pid_t>{survivors[1]}) << job.all_logs();
  EXPECT_EQ(children(job.pid(2)), newcomer) << job.all_logs();
  job.expect_exits({0, 1, 2, 3});
  // The entry into epoch 2 stopped on every rank; each held pieces of both layouts then.
  for (int k : {0, 1, 2}) {
    EXPECT_EQ(job.lines_with(k, "world of epoch 2 not entered").size(), 1u) << job.text(k);
    const std::vector<std::string> held = job.lines_with(k, "the move stopped midway; it holds");
    ASSERT_EQ(held.size(), 1u) << job.text(k);
    std::printf("[ says     ] %s\n", held[0].c_str());
  }
  EXPECT_EQ(job.lines_with(0, "the move stopped midway; it holds 2 pieces").size(), 1u)
      << job.text(0);
  ASSERT_NO_FATAL_FAILURE(expect_resumed_from_pieces(job, held_step, ref));
}

// The same join, the move stopped instead right after rank 1 copied its own part of a
// first-moment shard into its new one, before the rest of that shard came from rank 0
// (WEFT_TEST_STALL_MOVE=2:partial): rank 1 then holds that tensor in part and reports the
// boxes that arrived (parallel::Arrived); the world of four plans from them with the other
// pieces, resumes at the same step and gives one process's losses. On loopback the rest of
// the shard would come through shared memory; with `hosts` (each node a network namespace
// of its own) through the communicator, whose sender frees a source only once its receiver
// acknowledged it: the router's lines then show no byte through shared memory.
void stopped_with_a_tensor_filled_in_part(VirtualHosts* hosts) {
  LiveJob job;
  stopped_join(job, hosts ? "partial-hosts" : "partial", "partial");
  job.hosts = hosts;
  if (hosts)  // the router's byte counts too
    for (std::string& e : job.env)
      if (e.rfind("WEFT_LOG_SUBSYS=", 0) == 0) e = "WEFT_LOG_SUBSYS=resize,router";
  const std::vector<std::string> layout = job.sets;
  const fs::path ref = reference_run(job.dir, job.steps, layout);
  job.start_in_order(2);
  ASSERT_TRUE(job.wait_steps(30)) << job.all_logs();
  const std::vector<pid_t> survivors = {children(job.pid(0)).at(0), children(job.pid(1)).at(0)};
  job.start(hosts ? 2 : -1);  // epoch 2: world 3
  ASSERT_TRUE(poll_until([&] { return !job.lines_with(1, "the move stops after").empty(); }))
      << job.all_logs();
  const size_t held_step = job.rows().size();
  job.start(hosts ? 3 : -1);  // epoch 3: world 4
  // Its first line only, as above (the suite saw this world at step 113 of 120).
  ASSERT_TRUE(job.wait_world(4)) << phases_text(job.phases()) << job.all_logs();
  EXPECT_EQ(children(job.pid(0)), std::vector<pid_t>{survivors[0]}) << job.all_logs();
  EXPECT_EQ(children(job.pid(1)), std::vector<pid_t>{survivors[1]}) << job.all_logs();
  job.expect_exits({0, 1, 2, 3});
  const std::vector<std::string> held = job.lines_with(1, "the move stopped midway; it holds");
  ASSERT_EQ(held.size(), 1u) << job.text(1);
  std::printf("[ says     ] %s\n", held[0].c_str());
  const size_t at = held[0].find("MiB; ");
  ASSERT_NE(at, std::string::npos) << held[0];
  EXPECT_GT(std::stoll(held[0].substr(at + 5)), 0) << held[0];
  EXPECT_NE(held[0].find("boxes of tensors that arrived in part"), std::string::npos) << held[0];
  if (hosts) {
    // Every move's router line on every rank (the move into epoch 3 wrote one on each).
    for (int k : {0, 1, 2, 3}) {
      const std::vector<std::string> lines = job.lines_with(k, "router transition (rank ");
      ASSERT_FALSE(lines.empty()) << job.text(k);
      for (const std::string& l : lines)
        EXPECT_NE(l.find("; 0 B out, 0 B in through shared memory"), std::string::npos) << l;
    }
  }
  ASSERT_NO_FATAL_FAILURE(expect_resumed_from_pieces(job, held_step, ref));
}

TEST(LiveResizeOldState, AMoveStoppedWithATensorFilledInPartResumesFromItsArrivedBoxes) {
  stopped_with_a_tensor_filled_in_part(nullptr);
}

TEST(LiveResizeOldState, AMoveStoppedBetweenHostsWithATensorFilledInPartResumesFromItsArrivedBoxes) {
  std::string why;
  if (!VirtualHosts::available(&why)) GTEST_SKIP() << why;
  VirtualHosts hosts(4);
  stopped_with_a_tensor_filled_in_part(&hosts);
}

}  // namespace
}  // namespace weft::test
