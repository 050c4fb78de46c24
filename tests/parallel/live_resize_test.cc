// Online resize with real agents and workers on this machine (one agent per node, nodes on
// loopback): elastic.on_change: reshard. Workers are SIGKILLed and nodes join mid-run; the
// survivors keep their processes (the same PIDs before and after), the router moves the
// live state into the new world's layout, and the run's losses equal one process's step
// for step. No timing thresholds: every wait is bounded by a patience far beyond its need.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <optional>

#include "tests/support/live_job.h"
#include "tests/support/metrics_compare.h"

namespace weft::test {
namespace {

using namespace live;

// After a leave: the agents of nodes 0 and 1 kept their worker processes (`before`: each
// agent's children before the change) and end with 0.
void expect_survivors_kept_and_ended_ok(LiveJob& job,
                                        const std::vector<std::vector<pid_t>>& before) {
  for (int k : {0, 1}) EXPECT_EQ(children(job.pid(k)), before[size_t(k)]) << "agent " << k;
  for (int k : {0, 1}) {
    std::optional<int> c = job.wait(k);
    ASSERT_TRUE(c) << job.all_logs();
    EXPECT_EQ(*c, 0) << job.all_logs();
  }
}

// A ZeRO-1 job (dp auto) of 200 steps on up to `nodes` loopback nodes, where each node holds
// the only copy of its share of Adam's moments; returns its reference run (one process).
fs::path zero1_job(LiveJob& job, const std::string& name, int nodes) {
  job.dir = agent_test_dir("live_resize", name);
  job.id = "live-" + name;
  job.nnodes = "2:" + std::to_string(nodes);
  job.steps = 200;
  job.sets = {"parallel.dp=auto", "parallel.zero=1"};
  return reference_run(job.dir, job.steps, job.sets);
}

// The first rank whose move stops (WEFT_TEST_STALL_MOVE) holds up the others (they wait on
// it), so one such line anywhere is enough.
const char* const kMoveStopped = "the move stops after";

// dp4 -> dp2 (two workers SIGKILLed; their nodes leave) -> dp3 (a node joins): the survivors
// keep their processes, take the state from each other (every DP replica holds all of it),
// and the run equals one process's.
TEST(LiveResize, Dp4ToDp2ByKillsThenDp3ByAJoinKeepsSurvivorsAndTheNumbers) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize", "dp");
  job.id = "live-dp";
  // Both changes are over within 60 to 80 steps (the join itself takes 1 to 2 s); the rest
  // of the run and its reference are only time.
  job.steps = 300;
  job.sets = {"parallel.dp=auto"};
  const fs::path ref = reference_run(job.dir, job.steps, job.sets);
  // The old state kept whole until each new world is entered (not the default).
  job.sets.push_back("elastic.old_state=keep_unless_backed");
  job.start_in_order(4);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(4);
  for (int k = 0; k < 4; ++k) before[size_t(k)] = children(job.pid(k));
  for (int k = 0; k < 4; ++k) ASSERT_EQ(before[size_t(k)].size(), 1u) << "agent " << k;
  for (int k : {2, 3}) ::kill(before[size_t(k)][0], SIGKILL);
  ASSERT_TRUE(job.wait_world(2, 20)) << phases_text(job.phases()) << job.all_logs();
  // The two nodes whose worker died leave the job (no restarts left); the others go on.
  for (int k : {2, 3}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 1) << job.all_logs();
  }
  job.start();  // a fourth node... the job's third after the losses
  ASSERT_TRUE(job.wait_world(3, 10)) << phases_text(job.phases()) << job.all_logs();
  std::printf("[ measured ] both changes over with %zu of %d steps logged\n", job.rows().size(),
              job.steps);
  // The survivors' workers are the same processes as before both changes.
  for (int k : {0, 1}) EXPECT_EQ(children(job.pid(k)), before[size_t(k)]) << "agent " << k;
  for (int k : {0, 1, 4}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  const auto p = job.phases();
  ASSERT_EQ(p.size(), 3u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(4, 1)) << phases_text(p);
  EXPECT_EQ(p[1].first.first, 2) << phases_text(p);
  EXPECT_EQ(p[2].first.first, 3) << phases_text(p);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  const std::string lead = slurp(job.logs[0]);
  const std::vector<std::string> shrink = lines_with(lead, "world 4 -> 2");
  ASSERT_EQ(shrink.size(), 1u) << lead;
  expect_state_from_survivors(shrink[0], 2);
  EXPECT_NE(lead.find("world 2 -> 3"), std::string::npos) << lead;
  // No snapshots and keep_unless_backed: the live state is held until each world is entered.
  EXPECT_EQ(lead.find("freed its old state as it moved"), std::string::npos) << lead;
  // A survivor whose collective failed poked its agent, which looked at the membership at
  // once instead of at its next monitor pass (heartbeat.h).
  const std::string poke = "lost a peer; looking at the membership now";
  EXPECT_TRUE(lead.find(poke) != std::string::npos ||
              slurp(job.logs[1]).find(poke) != std::string::npos)
      << lead;
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);  // kept for a look otherwise
}

// A graceful leave (SIGTERM to one agent: a preemption notice) under ZeRO-1: the leaving
// node holds the only copy of a third of Adam's moments, so it hands them over in the new
// epoch's first world before its worker exits 0; dp3 -> dp2 goes on from the survivors'
// state with no checkpoint at all, and equals one process.
TEST(LiveResize, GracefulLeaveHandsItsZeroShardOverAndExitsZero) {
  LiveJob job;
  const fs::path ref = zero1_job(job, "leave", 3);  // the leave is over within about 50 steps
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(3);
  for (int k = 0; k < 3; ++k) before[size_t(k)] = children(job.pid(k));
  ::kill(job.pid(2), SIGTERM);
  ASSERT_TRUE(job.wait_world(2, 10)) << phases_text(job.phases()) << job.all_logs();
  std::printf("[ measured ] the leave was over with %zu of %d steps logged\n", job.rows().size(),
              job.steps);
  std::optional<int> code = job.wait(2);
  ASSERT_TRUE(code) << job.all_logs();
  EXPECT_EQ(*code, 0) << job.all_logs();
  ASSERT_NO_FATAL_FAILURE(expect_survivors_kept_and_ended_ok(job, before));
  const auto p = job.phases();
  ASSERT_EQ(p.size(), 2u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(3, 1)) << phases_text(p);
  EXPECT_EQ(p[1].first.first, 2) << phases_text(p);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  const std::string lead = slurp(job.logs[0]), leaver = slurp(job.logs[2]);
  EXPECT_NE(lead.find("world 3 -> 2"), std::string::npos) << lead;
  // The leaver is one of the holders: its shard of the moments exists nowhere else.
  EXPECT_NE(lead.find("state from 3 holders through the router"), std::string::npos) << lead;
  EXPECT_NE(leaver.find("left the job after handing its state over (through the router)"),
            std::string::npos)
      << leaver;
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// Two graceful leaves at once (a scheduler shrinking the job by two nodes: SIGTERM to both
// agents together) under ZeRO-1, where each leaver holds the only copy of a quarter of Adam's
// moments. Their two writes form one epoch (the survivors' last call for leaves; or two in a
// row, the second listing both leavers, when the second write comes after the first's epoch
// formed); either way both hand their shards over, exit 0, and the two survivors go on as
// dp2 with one process's numbers.
TEST(LiveResize, TwoGracefulLeavesAtOnceBothHandOverAndExitZero) {
  LiveJob job;
  const fs::path ref = zero1_job(job, "leave2", 4);
  job.start_in_order(4);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(4);
  for (int k = 0; k < 4; ++k) before[size_t(k)] = children(job.pid(k));
  ::kill(job.pid(2), SIGTERM);
  ::kill(job.pid(3), SIGTERM);
  ASSERT_TRUE(job.wait_world(2, 10)) << phases_text(job.phases()) << job.all_logs();
  for (int k : {2, 3}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << "leaver " << k << " did not exit\n" << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
    EXPECT_NE(slurp(job.logs[size_t(k)]).find("left the job after handing its state over"),
              std::string::npos)
        << job.text(k);
  }
  ASSERT_NO_FATAL_FAILURE(expect_survivors_kept_and_ended_ok(job, before));
  const auto p = job.phases();
  ASSERT_GE(p.size(), 2u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(4, 1)) << phases_text(p);
  EXPECT_EQ(p.back().first.first, 2) << phases_text(p);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// A second leave while the first leave's move still runs (the move into epoch 2 stops at
// half of each rank's bytes, WEFT_TEST_STALL_MOVE, with a router budget small enough for many
// waves, until a newer epoch aborts it): epoch 3 still lists the first leaver as departed (its
// hand-over was never confirmed), so both leavers hand over there, and dp4 -> dp2 goes on from
// the live state, with no checkpoint, equal to one process. Before, epoch 3 dropped the first
// leaver, whose quarter of Adam's moments was then in no world: the job started over.
TEST(LiveResize, ALeaveDuringAnEarlierLeavesMoveHandsBothOver) {
  LiveJob job;
  const fs::path ref = zero1_job(job, "leavemid", 4);
  job.env = {"WEFT_TEST_STALL_MOVE=2:50", "WEFT_ROUTER_BUDGET_BYTES=65536"};
  job.start_in_order(4);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(4);
  for (int k = 0; k < 4; ++k) before[size_t(k)] = children(job.pid(k));
  ::kill(job.pid(3), SIGTERM);  // epoch 2: three members, node 3 departing
  ASSERT_TRUE(job.wait_line_anywhere(kMoveStopped)) << job.all_logs();
  ::kill(job.pid(2), SIGTERM);  // epoch 3: two members
  ASSERT_TRUE(job.wait_world(2, 10)) << phases_text(job.phases()) << job.all_logs();
  for (int k : {2, 3}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << "leaver " << k << " did not exit\n" << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
    EXPECT_EQ(job.lines_with(k, "left the job after handing its state over").size(), 1u)
        << job.text(k);
  }
  // The first leaver's world of epoch 2 was replaced; it handed over in epoch 3's.
  EXPECT_EQ(job.lines_with(3, "world of epoch 2 not entered").size(), 1u) << job.text(3);
  EXPECT_EQ(job.lines_with(3, "rank 3 of epoch 3 left the job").size(), 1u) << job.text(3);
  ASSERT_NO_FATAL_FAILURE(expect_survivors_kept_and_ended_ok(job, before));
  const auto p = job.phases();
  ASSERT_EQ(p.size(), 2u) << phases_text(p);
  EXPECT_EQ(p[0].first, WorldEpoch(4, 1)) << phases_text(p);
  EXPECT_EQ(p[1].first, WorldEpoch(2, 3)) << phases_text(p);
  const std::string lead = slurp(job.logs[0]);
  EXPECT_EQ(lead.find("started over"), std::string::npos) << lead;
  EXPECT_NE(lead.find("through the router"), std::string::npos) << lead;
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// A departing node killed (its agent and its worker, SIGKILL) while its hand-over's move
// stands still (WEFT_TEST_STALL_MOVE=2:50): its heartbeat, kept while it departs, goes with
// its store connection, so an epoch forms without it at once; the world that waited for its
// worker is replaced and the survivors resume from the latest checkpoint (its ZeRO shard died
// with it), equal to one process. Before, its key went at the leave and nobody saw it die:
// the survivors sat in the stopped move until WEFT_RESIZE_TIMEOUT_MS, then waited as long
// again for a notice that never came. Both timeouts are set far beyond the test's patience,
// so such a wait fails it.
TEST(LiveResize, ADepartingNodeKilledDuringItsHandOverIsDroppedAndTheOthersResume) {
  LiveJob job;
  const fs::path ref = zero1_job(job, "leavekill", 3);
  for (const std::string& s : {"checkpoint.dir=" + (job.dir / "ckpt").string(),
                               std::string("checkpoint.every=5"),
                               std::string("checkpoint.async=false")})
    job.sets.push_back(s);
  job.env = {"WEFT_TEST_STALL_MOVE=2:50", "WEFT_ROUTER_BUDGET_BYTES=65536",
             "WEFT_RESIZE_TIMEOUT_MS=600000", "WEFT_COMM_TIMEOUT_MS=600000"};
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(20)) << job.all_logs();
  std::vector<std::vector<pid_t>> before(3);
  for (int k = 0; k < 3; ++k) before[size_t(k)] = children(job.pid(k));
  ::kill(job.pid(2), SIGTERM);  // epoch 2: two members, node 2 departing
  ASSERT_TRUE(job.wait_line_anywhere(kMoveStopped)) << job.all_logs();
  for (pid_t worker : before[2]) ::kill(worker, SIGKILL);
  ::kill(job.pid(2), SIGKILL);
  ASSERT_TRUE(job.wait_world(2, 10)) << phases_text(job.phases()) << job.all_logs();
  const std::string formed = "gone before its hand-over was confirmed";  // whoever formed it
  EXPECT_NE((job.text(0) + job.text(1)).find(formed), std::string::npos)
      << job.text(0) << job.text(1);
  ASSERT_NO_FATAL_FAILURE(expect_survivors_kept_and_ended_ok(job, before));
  EXPECT_NE(slurp(job.logs[0]).find("resumed from the latest checkpoint"), std::string::npos)
      << job.text(0);
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, kRelDp);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
