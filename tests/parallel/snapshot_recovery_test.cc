// In-memory snapshots end to end (issue 15): weft run starts the node's snapshot agent, the
// workers copy their state into it every step, and after a SIGKILL the job resumes from it,
// not from a disk checkpoint, with the numbers of a run that never failed. Real processes,
// real signals; every process is reaped and every segment of the test's jobs removed, however
// the test ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/support/live_job.h"
#include "tests/support/snapshot_leftovers.h"
#include "tests/support/snapshot_steps.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using live::children;
using live::poll_until;

std::string slurp_file(const fs::path& p) { return slurp(p); }

// Flips one byte of segment `own`'s newest slot, which must hold `step`: one corrupt block,
// found by its checksum when the slot is read. The job must not have gone past its next
// snapshot meanwhile.
void flip_a_byte_of_the_newest_slot(live::LiveJob& job, const std::string& own, int64_t step) {
  {
    checkpoint::SnapshotSegment seg = checkpoint::SnapshotSegment::open(own, true);
    const std::optional<checkpoint::SnapshotSegment::View> v = seg.latest();
    ASSERT_TRUE(v.has_value());
    ASSERT_EQ(v->meta.step, step) << "the job took its next snapshot before the test acted";
    const_cast<uint8_t*>(static_cast<const uint8_t*>(v->payload))[v->meta.payload_bytes / 3] ^= 1;
    ASSERT_EQ(seg.corrupt_blocks(*v).size(), 1u);
  }
  ASSERT_LT(job.rows().size(), size_t(step) + 50) << "the job ran past its next snapshot";
}

// The step lines of a metrics file so far (0 while it does not exist).
size_t metrics_lines(const fs::path& p) {
  try {
    return metrics_losses(p).size();
  } catch (const std::exception&) {
    return 0;
  }
}

// One machine, three workers, ZeRO-1 over dp3: each rank holds the only copy of a third of
// Adam's moments, so nothing alive covers the state after a kill. The standalone agent
// replaces the killed worker in place (the others keep their processes); the new world
// finds every rank's snapshot in the node's agent and resumes from them through the router.
class SnapshotRecovery : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("weft-snaprec-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> run_args(const std::string& id, const fs::path& out,
                                    const std::vector<std::string>& extra,
                                    int steps = kSteps) const {
    std::vector<std::string> a = {"run",
                                  "--standalone",
                                  "--nproc-per-node",
                                  "3",
                                  "--max-restarts",
                                  "1",
                                  "--monitor-interval",
                                  "0.05",
                                  "--rdzv-id",
                                  id,
                                  "--",
                                  WEFT_BINARY,
                                  "train"};
    std::vector<std::string> sets = {"parallel.zero=1", "snapshot.every=1"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    for (const std::string& x : live::train_args(out, steps, sets)) a.push_back(x);
    a.insert(a.end(), {"--save-weights", (out / "weights.safetensors").string()});
    return a;
  }

  // SIGKILLs rank 1 of `run` (mid-step, or mid-copy of its snapshot) once `at` steps of
  // `out`'s metrics are logged, and waits for the job, which must end well. Returns the steps
  // logged at the kill and the run's log (dir_/run.log); `resumed` the step the log says the
  // job resumed at.
  struct Killed {
    size_t at_kill = 0;
    std::string log;
    long resumed = -1;
  };
  Killed kill_rank1_at(Agents& agents, pid_t run, const fs::path& out, size_t at) const {
    Killed k;
    auto logged = [&] { return metrics_lines(out / "metrics.jsonl"); };
    EXPECT_TRUE(poll_until([&] { return logged() >= at; }, 120)) << slurp_file(dir_ / "run.log");
    std::vector<pid_t> workers = children(run);
    EXPECT_EQ(workers.size(), 3u) << slurp_file(dir_ / "run.log");
    k.at_kill = logged();
    EXPECT_LT(k.at_kill, size_t(kSteps)) << "the job ended before the kill: make kSteps larger";
    if (workers.size() == 3) ::kill(workers[1], SIGKILL);
    EXPECT_EQ(agents.wait(run), 0) << slurp_file(dir_ / "run.log");
    k.log = slurp_file(dir_ / "run.log");
    const size_t r = k.log.find("resumed at step ");
    EXPECT_NE(r, std::string::npos) << k.log;
    if (r != std::string::npos) k.resumed = std::stol(k.log.substr(r + 16));
    return k;
  }

  static constexpr int kSteps = 160;
  fs::path dir_;
};

// The agent is killed and restarted by weft run first (it adopts the segments), then a
// worker: the job resumes from the snapshots all the same.
TEST_F(SnapshotRecovery, AKilledWorkerResumesFromTheNodesSnapshotsWithTheSameWeightsBitwise) {
  Agents agents({"OMP_NUM_THREADS=1"});
  // The uninterrupted run on the same layout, snapshots on as well.
  const std::string ref_id = "snaprec-ref-" + std::to_string(::getpid());
  SnapshotLeftovers ref_segments{checkpoint::job_id_for_run(ref_id)};
  const pid_t ref = agents.start(run_args(ref_id, dir_ / "ref", {}), dir_ / "ref.log");
  ASSERT_EQ(agents.wait(ref), 0) << slurp_file(dir_ / "ref.log");
  // Finished well: the agent removed the job's segments.
  EXPECT_TRUE(checkpoint::snapshot_segments(ref_segments.job).empty());

  const std::string id = "snaprec-" + std::to_string(::getpid());
  SnapshotLeftovers segments{checkpoint::job_id_for_run(id)};
  const fs::path out = dir_ / "run";
  const pid_t run = agents.start(run_args(id, out, {}), dir_ / "run.log");
  auto logged = [&] { return metrics_lines(out / "metrics.jsonl"); };
  // The snapshot agent is SIGKILLed first: weft run starts another, which adopts the
  // segments, and the workers' snapshots go on into them.
  ASSERT_TRUE(poll_until([&] { return logged() >= 20; }, 120)) << slurp_file(dir_ / "run.log");
  const std::string started = "started the snapshot agent (pid ";
  const std::string before = slurp_file(dir_ / "run.log");
  ASSERT_NE(before.find(started), std::string::npos) << before;
  const pid_t agent = pid_t(std::stol(before.substr(before.find(started) + started.size())));
  ::kill(agent, SIGKILL);
  ASSERT_TRUE(poll_until(
      [&] {
        return slurp_file(dir_ / "run.log").find("3 segment(s) adopted)") != std::string::npos;
      },
      60))
      << slurp_file(dir_ / "run.log");
  const Killed k = kill_rank1_at(agents, run, out, 40);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string& log = k.log;
  // Resumed from the snapshots of all three ranks, at most a step or two before the kill,
  // and no disk checkpoint exists to come from.
  EXPECT_GE(k.resumed, long(k.at_kill) - 2) << log;
  EXPECT_LE(k.resumed, long(k.at_kill) + 2) << log;
  // The holders' choice: the survivors' live state does not cover rank 1's shard, so the
  // new world resumes from snapshots (rank 1's, with the others' live state when they are
  // of the same step, else every rank's), and says so.
  EXPECT_NE(log.find("replaced in place (1 of --max-restarts 1 used)"), std::string::npos) << log;
  EXPECT_NE(log.find("nobody alive holds all of the state: resumed at step "), std::string::npos)
      << log;
  EXPECT_NE(log.find("of them in-memory snapshots ("), std::string::npos) << log;
  EXPECT_EQ(log.find("resuming from the latest checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("weft run: restarting the snapshot agent (it adopts its segments)"),
            std::string::npos)
      << log;
  // The agent outlived the workers and the job's end removed its segments.
  EXPECT_NE(log.find("the job ended well; the snapshot agent removed its 3 segment(s)"),
            std::string::npos)
      << log;
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());

  // The same numbers as the run that never failed: every loss, and the final weights bit
  // for bit (the same layout; the router copies bytes).
  expect_same_losses(dir_ / "ref" / "metrics.jsonl", out / "metrics.jsonl", kSteps, false, 0.0);
  EXPECT_EQ(slurp_file(dir_ / "ref" / "weights.safetensors"),
            slurp_file(out / "weights.safetensors"));
}

// snapshot.every: auto. The world takes a probe snapshot after 4 steps, times its copy against
// the steps before it and agrees on an interval N (rank 0 says which); the snapshots then come
// every N steps, so a SIGKILLed worker's job resumes at a multiple of N (or at the probe),
// within two intervals of the kill.
TEST_F(SnapshotRecovery, EveryAutoChoosesAnIntervalAndTheJobResumesOnIt) {
  Agents agents({"OMP_NUM_THREADS=1"});
  const std::string id = "snapauto-" + std::to_string(::getpid());
  SnapshotLeftovers segments{checkpoint::job_id_for_run(id)};
  const fs::path out = dir_ / "run";
  const pid_t run = agents.start(run_args(id, out, {"snapshot.every=auto"}), dir_ / "run.log");
  const std::string chose = "snapshot.every auto: a snapshot every ";
  ASSERT_TRUE(poll_until(
      [&] { return slurp_file(dir_ / "run.log").find(chose) != std::string::npos; }, 120))
      << slurp_file(dir_ / "run.log");
  const std::string said = slurp_file(dir_ / "run.log");
  const long every = std::stol(said.substr(said.find(chose) + chose.size()));
  std::printf(
      "[ says     ] %s\n",
      said.substr(said.find(chose), said.find('\n', said.find(chose)) - said.find(chose)).c_str());
  ASSERT_GE(every, 1);
  // This model's state is about 1 MiB a rank: its copy takes about a millisecond against
  // steps of tens, so the interval is small unless the timing went wrong.
  ASSERT_LE(every, 40) << said;
  const Killed k = kill_rank1_at(agents, run, out, size_t(4 + 3 * every + 5));
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string& log = k.log;
  const long step = k.resumed;
  EXPECT_TRUE(step == 4 || step % every == 0) << "resumed at " << step << ", every " << every;
  EXPECT_GE(step, long(k.at_kill) - 2 * every - 2) << log;
  EXPECT_LE(step, long(k.at_kill) + 2) << log;
  EXPECT_NE(log.find("of them in-memory snapshots ("), std::string::npos) << log;
  // The new world chose again.
  EXPECT_NE(log.find(chose, log.find(chose) + 1), std::string::npos) << log;
}

// A snapshot whose bytes went bad in memory is found by its checksum when it is read: rank 0's
// newest snapshot (step 100) gets a flipped byte and rank 1 is killed. Every slot is offered
// from its header; step 100's group is chosen, the worker that reads rank 0's snapshot finds
// the corrupt block, the world votes it out and chooses again: step 100 has no other copy
// (snapshot.redundancy none), so the older slots (step 50), which every rank has whole, serve.
// The numbers still equal the run that never failed, bit for bit.
// (The job ends at step 160, soon after the last snapshot the test may act before: the
// redone steps and both runs' tails are what this test's time goes to.)
TEST_F(SnapshotRecovery, ACorruptSnapshotIsFoundWhenReadAndTheOlderCompleteStepServes) {
  Agents agents({"OMP_NUM_THREADS=1"});
  const int steps = 160;
  const std::vector<std::string> every = {"snapshot.every=50"};
  const std::string ref_id = "snapcor-ref-" + std::to_string(::getpid());
  SnapshotLeftovers ref_segments{checkpoint::job_id_for_run(ref_id)};
  const pid_t ref = agents.start(run_args(ref_id, dir_ / "ref", every, steps), dir_ / "ref.log");
  ASSERT_EQ(agents.wait(ref), 0) << slurp_file(dir_ / "ref.log");

  const std::string id = "snapcor-" + std::to_string(::getpid());
  SnapshotLeftovers segments{checkpoint::job_id_for_run(id)};
  const fs::path out = dir_ / "run";
  const pid_t run = agents.start(run_args(id, out, every, steps), dir_ / "run.log");
  // Between step 105 and 150: every rank's newest snapshot is step 100's, the older 50's.
  auto logged = [&] { return metrics_lines(out / "metrics.jsonl"); };
  ASSERT_TRUE(poll_until([&] { return logged() >= 105; }, 120)) << slurp_file(dir_ / "run.log");
  std::string rank0;
  for (const std::string& n : checkpoint::snapshot_segments(segments.job))
    if (n.size() > 3 && n.substr(n.size() - 3) == "-r0") rank0 = n;
  ASSERT_FALSE(rank0.empty());
  {
    checkpoint::SnapshotSegment seg = checkpoint::SnapshotSegment::open(rank0, true);
    std::optional<checkpoint::SnapshotSegment::View> v = seg.latest();
    ASSERT_TRUE(v.has_value());
    ASSERT_EQ(v->meta.step, 100) << "the job ran past step 150 before the test acted";
    auto* p = const_cast<uint8_t*>(static_cast<const uint8_t*>(v->payload));
    p[v->meta.payload_bytes / 2] ^= 0x01;
  }
  std::vector<pid_t> workers = children(run);
  ASSERT_EQ(workers.size(), 3u) << slurp_file(dir_ / "run.log");
  ASSERT_LT(logged(), size_t(150)) << "the job ran past step 150 before the kill";
  ::kill(workers[1], SIGKILL);
  ASSERT_EQ(agents.wait(run), 0) << slurp_file(dir_ / "run.log");
  const std::string log = slurp_file(dir_ / "run.log");
  // The reading worker names the slot and the block; rank 0 says what failed and where the
  // state comes from instead.
  EXPECT_NE(log.find(" of " + rank0 + " (old rank 0, step 100) not read: " + rank0 +
                     ": 1 corrupt block(s) of 1048576 bytes"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("the in-memory snapshot(s) of step 100 chosen for this world failed their "
                     "read (old rank 0's (world 3) the node's own on rank "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("chose again without them: step 50 (epoch "), std::string::npos) << log;
  EXPECT_NE(log.find("resumed at step 50 ("), std::string::npos) << log;
  EXPECT_NE(log.find("from 3 holders, 3 of them in-memory snapshots (3 own)"), std::string::npos)
      << log;
  expect_same_losses(dir_ / "ref" / "metrics.jsonl", out / "metrics.jsonl", size_t(steps), false,
                     0.0);
  EXPECT_EQ(slurp_file(dir_ / "ref" / "weights.safetensors"),
            slurp_file(out / "weights.safetensors"));
}

// Three nodes of one worker each (loopback), ZeRO-1 over dp3, snapshot.redundancy: none:
// node 2's snapshots exist only on node 2, so when its worker dies the node does not leave
// (the others could not restore its shard): its worker is replaced in place, the other
// nodes' workers keep their processes, the new world restores rank 2's shard from node 2's
// snapshots, and the run equals one process's.
// Three loopback nodes of one worker each under ZeRO-1 over dp3, a snapshot every step
// (`extra`: more --set overrides), 200 steps (the kill comes at step 40 and the new world
// forms within about 60 more; the rest is only time); `name` names the test's folder and job.
void three_zero1_nodes(live::LiveJob& job, const std::string& name, int max_restarts,
                       const std::vector<std::string>& extra = {}) {
  job.dir = agent_test_dir("snapshot_recovery", name);
  job.id = "snap-" + name + "-" + std::to_string(::getpid());
  job.nnodes = "2:3";
  job.max_restarts = max_restarts;
  job.steps = 200;
  job.sets = {"parallel.dp=auto", "parallel.zero=1", "snapshot.every=1"};
  job.sets.insert(job.sets.end(), extra.begin(), extra.end());
}

// SIGKILLs node 2's worker (its weft run and snapshot agent live on).
void kill_node2_worker(live::LiveJob& job) {
  std::vector<pid_t> victim = children(job.pid(2));
  ASSERT_EQ(victim.size(), 1u) << job.all_logs();
  ::kill(victim[0], SIGKILL);
}

TEST(SnapshotRecoveryMultiNode, AFailedWorkerWhoseSnapshotsExistOnlyOnItsNodeIsReplacedInPlace) {
  live::LiveJob job;
  three_zero1_nodes(job, "multinode", 1);
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = live::reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(3);
  ASSERT_TRUE(job.wait_steps(40)) << job.all_logs();
  const std::vector<pid_t> survivors = {children(job.pid(0)).at(0), children(job.pid(1)).at(0)};
  ASSERT_NO_FATAL_FAILURE(kill_node2_worker(job));
  ASSERT_TRUE(job.wait_world(3, 2, 2)) << live::phases_text(job.phases()) << job.all_logs();
  std::printf("[ measured ] replaced with %zu of %d steps logged\n", job.rows().size(), job.steps);
  EXPECT_EQ(children(job.pid(0)), std::vector<pid_t>{survivors[0]}) << job.all_logs();
  EXPECT_EQ(children(job.pid(1)), std::vector<pid_t>{survivors[1]}) << job.all_logs();
  for (int k = 0; k < 3; ++k) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  const std::string lead = slurp(job.logs[0]);
  EXPECT_NE(job.text(2).find("replaced in place (1 of --max-restarts 1 used)"), std::string::npos)
      << job.text(2);
  EXPECT_EQ(job.all_logs().find("restarting the workers"), std::string::npos) << job.all_logs();
  EXPECT_EQ(job.text(2).find("left the job and joins again"), std::string::npos) << job.text(2);
  EXPECT_NE(lead.find("nobody alive holds all of the state: resumed at step "), std::string::npos)
      << lead;
  EXPECT_NE(lead.find("of them in-memory snapshots ("), std::string::npos) << lead;
  EXPECT_EQ(lead.find("resuming from the latest checkpoint"), std::string::npos) << lead;
  EXPECT_EQ(lead.find("starting over from step 0"), std::string::npos) << lead;
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, live::kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// A node joins a job of two that snapshots every step: the state each survivor holds when
// its world ends is also its node's latest snapshot, so the router takes the only handles on
// it and frees each old tensor as soon as it has moved (an entry that failed midway would
// leave the next world that snapshot, of the same step). The numbers stay one process's.
TEST(SnapshotRecoveryMultiNode, AGrowFreesTheSurvivorsOldStateAsItMovesWhenASnapshotBacksIt) {
  live::LiveJob job;
  three_zero1_nodes(job, "grow", 0);
  job.steps = 120;
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = live::reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(2);
  ASSERT_TRUE(job.wait_steps(30)) << job.all_logs();
  job.start();
  ASSERT_TRUE(job.wait_world(3, 10)) << job.all_logs();
  job.expect_exits({0, 1, 2});
  const std::string resize = job.only_resize_line();
  ASSERT_FALSE(resize.empty());
  EXPECT_NE(resize.find("world 2 -> 3"), std::string::npos) << resize;
  EXPECT_NE(resize.find("state from 2 holders through the router"), std::string::npos) << resize;
  EXPECT_NE(resize.find("rank 0 freed its old state as it moved, a snapshot of the same "
                        "step backing it"),
            std::string::npos)
      << resize;
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, live::kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// The same failure under snapshot.redundancy replica or ec. Node 2's snapshots also live on
// the other nodes (a replica on node 0, its successor in the ring; or parity on nodes 0 and 1),
// so node 2 need not hold the job: it leaves at once. The two survivors reshard without it,
// rank 2's ZeRO-1 shard from its replica or rebuilt from parity; the numbers stay one
// process's. Node 2 has no restarts left and stays out: with one, it may rejoin before the
// survivors' world of two forms, its epoch replaces theirs and it offers its own snapshots
// (correct too, and seen under load, but then neither the replica nor the parity is read).
void failed_worker_leaves_under(const std::string& redundancy) {
  const bool ec = redundancy == "ec";
  live::LiveJob job;
  three_zero1_nodes(job, redundancy, 0, {"snapshot.redundancy=" + redundancy});
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = live::reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(3);
  ASSERT_TRUE(poll_until(
      [&] {
        return ec ? !job.lines_with(0, "holding parity fragment 2 of stripe").empty() &&
                        !job.lines_with(1, "holding parity fragment 2 of stripe").empty()
                  : !job.lines_with(0, "holding replicas of node 2's rank 2 (epoch 1)").empty();
      },
      120))
      << job.all_logs();
  ASSERT_TRUE(job.wait_steps(40)) << job.all_logs();
  ASSERT_NO_FATAL_FAILURE(kill_node2_worker(job));
  for (int k = 0; k < 3; ++k) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    if (k < 2) {
      EXPECT_EQ(*code, 0) << job.all_logs();
    }
  }
  EXPECT_NE(job.text(2).find("leaves the job (no restarts left"), std::string::npos) << job.text(2);
  const std::vector<std::string> resizes = live::lines_with(job.text(0), "resize: epoch");
  ASSERT_EQ(resizes.size(), 1u) << job.all_logs();
  for (const std::string& l : resizes) std::printf("[ says     ] %s\n", l.substr(0, 500).c_str());
  EXPECT_NE(resizes[0].find("world 3 -> 2"), std::string::npos) << resizes[0];
  EXPECT_NE(resizes[0].find(ec ? "in-memory snapshots (2 own, 1 rebuilt from parity)"
                               : "in-memory snapshots (2 own, 1 replica)"),
            std::string::npos)
      << resizes[0];
  if (ec) {
    // weft run says what its agent does: erasure-coded over the three nodes of epoch 1, and
    // over the two of epoch 2, fewer than k + m, as one group with K = 1 (not as k + m).
    EXPECT_NE(job.text(0).find("erasure-coded over the epoch's 3 nodes"), std::string::npos)
        << job.text(0);
    EXPECT_EQ(job.text(0).find("erasure-coded over the epoch's 2 nodes"), std::string::npos)
        << job.text(0);
    EXPECT_NE(job.text(0).find("erasure-coded over one group of all 2 with K = 1"),
              std::string::npos)
        << job.text(0);
  }
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, live::kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

TEST(SnapshotRecoveryMultiNode, AFailedWorkerUnderReplicaLeavesAndItsShardComesFromTheReplica) {
  failed_worker_leaves_under("replica");
}

TEST(SnapshotRecoveryMultiNode, AFailedWorkerUnderEcLeavesAndItsShardIsRebuiltFromParity) {
  failed_worker_leaves_under("ec");
}

// A corrupt block in the slot the choice uses, with another copy of that step elsewhere:
// three nodes under replica, a snapshot every 50 steps (lockstep: every rank and every
// replica at the same step S). Between step S + 5 and the next snapshot, rank 0's own slot
// of step S (on node 0) gets a flipped byte and node 2's worker dies; node 2 leaves, and the
// survivors' live state lacks rank 2's shard, so step S's snapshots are chosen. Node 0's
// worker finds the block when it reads rank 0's snapshot; the world votes it out and chooses
// again at the same step: rank 0's replica on node 1 (the next source in the order),
// with rank 1's own snapshot and rank 2's replica on node 0. The numbers stay one process's.
TEST(SnapshotRecoveryMultiNode, ACorruptOwnSnapshotIsReadFromItsReplicaOnTheNextNodeInstead) {
  live::LiveJob job;
  three_zero1_nodes(job, "corrupt-replica", 0,
                    {"snapshot.redundancy=replica", "snapshot.every=50"});
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = live::reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(3);
  const std::string own =
      checkpoint::segment_name(segments.job, checkpoint::SegmentKind::kData, 0, 1, 0);
  const std::string replica =
      checkpoint::segment_name(segments.job, checkpoint::SegmentKind::kReplica, 0, 1, 0);
  ASSERT_TRUE(poll_until([&] { return newest_step(own) >= 50; }, 120)) << job.all_logs();
  const int64_t step = newest_step(own);
  ASSERT_TRUE(job.wait_steps(size_t(step) + 5)) << job.all_logs();
  ASSERT_TRUE(poll_until([&] { return newest_step(replica) == step; }, 60))
      << "rank 0's replica of step " << step << " is not on node 1\n"
      << job.all_logs();
  ASSERT_NO_FATAL_FAILURE(flip_a_byte_of_the_newest_slot(job, own, step));
  ASSERT_NO_FATAL_FAILURE(kill_node2_worker(job));
  for (int k = 0; k < 2; ++k) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  (void)job.wait(2);
  const std::string lead = job.text(0);
  EXPECT_NE(lead.find(" of " + own + " (old rank 0, step " + std::to_string(step) +
                      ") not read: " + own + ": 1 corrupt block(s)"),
            std::string::npos)
      << lead;
  EXPECT_NE(lead.find("chose again without them: step " + std::to_string(step) +
                      " (epoch 1) from 3 holders, 3 of them in-memory snapshots (1 own, 2 "
                      "replica(s), 0 rebuilt from parity)"),
            std::string::npos)
      << lead;
  const std::vector<std::string> resizes = live::lines_with(lead, "resize: epoch");
  ASSERT_EQ(resizes.size(), 1u) << job.all_logs();
  std::printf("[ says     ] %s\n", resizes[0].substr(0, 500).c_str());
  EXPECT_NE(resizes[0].find("resumed at step " + std::to_string(step) + " ("), std::string::npos)
      << resizes[0];
  EXPECT_NE(resizes[0].find("in-memory snapshots (1 own, 2 replicas)"), std::string::npos)
      << resizes[0];
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, live::kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

// The same corrupt block under ec, where the slot has parity and no other copy: three nodes,
// a snapshot every 50 steps, node 2's worker killed and replaced in place (--max-restarts 1:
// no node is lost, so every stripe keeps its other fragments). The new world chooses step S's
// own snapshots; node 0's worker finds the flipped byte as it reads rank 0's, asks its agent,
// which decodes that chunk from the stripe's other fragments in place, and reads it again:
// the world resumes at step S from its own snapshots without a vote, and the numbers stay
// one process's. (A new world's list no longer checksums the slots before it answers.)
TEST(SnapshotRecoveryMultiNode, ACorruptOwnSnapshotUnderEcIsRepairedFromParityWhenReadAndServes) {
  live::LiveJob job;
  three_zero1_nodes(job, "corrupt-ec", 1, {"snapshot.redundancy=ec", "snapshot.every=50"});
  SnapshotLeftovers segments{checkpoint::job_id_for_run(job.id)};
  const fs::path ref = live::reference_run(job.dir, job.steps, {"parallel.dp=auto"});
  job.start_in_order(3);
  const std::string own =
      checkpoint::segment_name(segments.job, checkpoint::SegmentKind::kData, 0, 1, 0);
  ASSERT_TRUE(poll_until([&] { return newest_step(own) >= 50; }, 120)) << job.all_logs();
  const int64_t step = newest_step(own);
  ASSERT_TRUE(job.wait_steps(size_t(step) + 5)) << job.all_logs();
  // Every parity fragment of epoch 1 holds step S (the lockstep keeps it at most one behind).
  ASSERT_TRUE(poll_until(
      [&] {
        int parity = 0;
        for (const std::string& n : checkpoint::snapshot_segments(segments.job)) {
          const auto p = checkpoint::parse_segment_name(n);
          if (!p || p->kind != checkpoint::SegmentKind::kParity) continue;
          ++parity;
          if (newest_step(n) != step) return false;
        }
        return parity > 0;
      },
      60))
      << "the parity of step " << step << " is not on its holders\n"
      << job.all_logs();
  ASSERT_NO_FATAL_FAILURE(flip_a_byte_of_the_newest_slot(job, own, step));
  ASSERT_NO_FATAL_FAILURE(kill_node2_worker(job));
  for (int k = 0; k < 3; ++k) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  const std::string lead = job.text(0);
  EXPECT_NE(lead.find(" of " + own + " (old rank 0, step " + std::to_string(step) +
                      ") not read: " + own + ": 1 corrupt block(s)"),
            std::string::npos)
      << lead;
  EXPECT_NE(lead.find("the node's agent repaired 1 corrupt block(s) from parity: read again"),
            std::string::npos)
      << lead;
  EXPECT_NE(lead.find(own + " slot "), std::string::npos) << lead;
  EXPECT_NE(lead.find("1 corrupt block(s); repaired from parity (1 chunk(s))"), std::string::npos)
      << lead;
  EXPECT_EQ(lead.find("chose again without them"), std::string::npos) << lead;
  const std::vector<std::string> resizes = live::lines_with(lead, "resize: epoch");
  ASSERT_EQ(resizes.size(), 1u) << job.all_logs();
  std::printf("[ says     ] %s\n", resizes[0].substr(0, 500).c_str());
  EXPECT_NE(resizes[0].find("resumed at step " + std::to_string(step) + " ("), std::string::npos)
      << resizes[0];
  EXPECT_NE(resizes[0].find("in-memory snapshots (3 own"), std::string::npos) << resizes[0];
  expect_same_losses(ref, job.metrics(), size_t(job.steps), false, live::kRelDp);
  EXPECT_TRUE(checkpoint::snapshot_segments(segments.job).empty());
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
