// `weft train` on several processes: under `weft run --standalone` (and mpirun when present)
// the metrics equal the single process's; bad degrees fail before any rank trains (exit 2,
// named field); a lost rank ends the job non-zero, naming it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/proc.h"
#include "comm/registry.h"
#include "core/data/dataset.h"
#include "core/io/metrics.h"
#include "parallel/trainer.h"
#include "tests/parallel/layout_harness.h"
#include "tests/support/metrics_compare.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
const std::string kWeft = WEFT_BINARY;
const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";

struct Result {
  int code;
  std::string out;
};

Result run(const std::string& cmdline) {
  std::string cmd = "OMP_NUM_THREADS=1 " + cmdline + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("weft_launch_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using test::expect_same_losses;
using test::metrics_losses;

TEST(WeftRun, TwoWorkersMatchOneProcess) {
  fs::path d = temp_dir("run");
  const std::string common = " train --config " + kConfig +
                             " --set train.steps=4 --set train.warmup_steps=1 --set "
                             "train.log_every=1 --set train.eval_every=2";
  Result one = run(kWeft + common + " --set train.out_dir=" + (d / "one").string());
  ASSERT_EQ(one.code, 0) << one.out;
  Result two = run(kWeft + " run --standalone --nproc-per-node 2 -- weft" + common +
                   " --set parallel.dp=2" + " --set train.out_dir=" + (d / "two").string() +
                   " --save-weights " + (d / "w.safetensors").string());
  ASSERT_EQ(two.code, 0) << two.out;
  // Rank 0 prints the progress lines; the launcher prefixes every line with its rank.
  EXPECT_NE(two.out.find("[rank 0] step     3/4 | loss"), std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("[rank 1] step"), std::string::npos) << two.out;
  expect_same_losses(d / "one" / "metrics.jsonl", d / "two" / "metrics.jsonl", 4);
  // Validation (rank 0, from the gathered weights) gives the single process's numbers too.
  expect_same_losses(d / "one" / "metrics.jsonl", d / "two" / "metrics.jsonl", 2, true);
  auto rows = core::io::read_metrics((d / "two" / "metrics.jsonl").string());
  EXPECT_EQ(rows.at(0).at("world"), 2);
  EXPECT_TRUE(fs::exists(d / "w.safetensors"));
  fs::remove_all(d);
}

// loss_free: validation on rank 0 rebuilds the model from gathered weights and must route
// with the trained bias too, or its loss drifts from the single process's.
TEST(WeftRun, LossFreeValidationRoutesWithTheTrainedBias) {
  fs::path d = temp_dir("lossfree");
  const std::string common = " train --config " + std::string(WEFT_SOURCE_DIR) +
                             "/configs/moe-layout.yaml --set train.steps=6 --set train.warmup_steps=1"
                             " --set train.eval_every=3 --set model.moe.balance=loss_free"
                             " --set model.moe.bias_update_rate=0.05";
  Result one = run(kWeft + common + " --set train.out_dir=" + (d / "one").string());
  ASSERT_EQ(one.code, 0) << one.out;
  Result two = run(kWeft + " run --standalone --nproc-per-node 2 -- weft" + common +
                   " --set parallel.dp=2 --set train.out_dir=" + (d / "two").string());
  ASSERT_EQ(two.code, 0) << two.out;
  expect_same_losses(d / "one" / "metrics.jsonl", d / "two" / "metrics.jsonl", 2, true);
  fs::remove_all(d);
}

// Open MPI's launcher: ranks from OMPI_COMM_WORLD_*, rank 0 serves the store.
TEST(Mpirun, TwoRanksMatchOneProcess) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "mpirun is not installed";
  fs::path d = temp_dir("mpirun");
  const std::string common =
      " train --config " + kConfig + " --set train.steps=3 --set train.warmup_steps=1";
  Result one = run(kWeft + common + " --set train.out_dir=" + (d / "one").string());
  ASSERT_EQ(one.code, 0) << one.out;
  std::string root = ::geteuid() == 0 ? " --allow-run-as-root" : "";
  Result two = run("mpirun" + root + " --oversubscribe -np 2 " + kWeft + common +
                   " --set parallel.dp=2" + " --set train.out_dir=" + (d / "two").string());
  ASSERT_EQ(two.code, 0) << two.out;
  expect_same_losses(d / "one" / "metrics.jsonl", d / "two" / "metrics.jsonl", 3);
  fs::remove_all(d);
}

TEST(WeftRun, LayoutThatDoesNotFitFailsBeforeTraining) {
  Result r = run(
      kWeft + " run --standalone --nproc-per-node 2 -- weft train --config " + kConfig +
      " --set parallel.dp=1 --set parallel.tp=3 --set train.steps=2 --set train.warmup_steps=1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("parallel.tp"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| loss"), std::string::npos) << r.out;
  Result heads = run(
      kWeft + " run --standalone --nproc-per-node 3 -- weft train --config " + kConfig +
      " --set parallel.dp=1 --set parallel.tp=3 --set train.steps=2 --set train.warmup_steps=1");
  EXPECT_EQ(heads.code, 2) << heads.out;
  EXPECT_NE(heads.out.find("parallel.tp"), std::string::npos) << heads.out;
  // A layout over the per-rank memory budget fails the same way, naming the budget.
  Result fat = run("WEFT_MEMORY_GIB=0.0005 " + kWeft +
                   " run --standalone --nproc-per-node 2 -- weft train --config " + kConfig +
                   " --set parallel.dp=2 --set train.steps=2 --set train.warmup_steps=1");
  EXPECT_EQ(fat.code, 2) << fat.out;
  EXPECT_NE(fat.out.find("over the budget of 0.0005 GiB per rank"), std::string::npos) << fat.out;
  EXPECT_EQ(fat.out.find("| loss"), std::string::npos) << fat.out;
}

// `weft run` with two dp workers training "forever", its output going to `log`.
pid_t start_job(const fs::path& d, const fs::path& log) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  std::string out = log.string();
  int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  std::string outdir = "train.out_dir=" + (d / "run").string();
  ::execl(kWeft.c_str(), "weft", "run", "--standalone", "--nproc-per-node", "2", "--", "weft",
          "train", "--config", kConfig.c_str(), "--set", "parallel.dp=2", "--set",
          "train.steps=100000", "--set", "train.log_every=1", "--set", outdir.c_str(), nullptr);
  ::_exit(127);
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Waits for the job to exit (at most 90 s, then kills it); false when it had to be killed.
bool wait_job(pid_t pid, int& status) {
  auto t0 = std::chrono::steady_clock::now();
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(90)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// Waits until rank 0 printed a step and rank `rank` runs; returns its pid (-1 on timeout).
pid_t wait_training(pid_t job, const fs::path& log, int rank) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t w = -1;
    if (read_all(log).find("| loss") != std::string::npos && (w = worker_child(job, rank)) > 0)
      return w;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

TEST(WeftRun, KilledWorkerEndsTheJobNamingIt) {
  fs::path d = temp_dir("kill");
  fs::path log = d / "out.txt";
  pid_t pid = start_job(d, log);
  ASSERT_GE(pid, 0);
  pid_t victim = wait_training(pid, log, 1);
  if (victim <= 0) ::kill(pid, SIGKILL);
  ASSERT_GT(victim, 0) << "training did not start: " << read_all(log);
  ::kill(victim, SIGKILL);  // as a crash would
  int status = 0;
  ASSERT_TRUE(wait_job(pid, status)) << "weft run did not end after its rank 1 was killed";
  std::string text = read_all(log);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_NE(WEXITSTATUS(status), 0) << text;
  EXPECT_NE(text.find("lost rank 1"), std::string::npos) << text;
  fs::remove_all(d);
}

TEST(WeftRun, CtrlCStopsEveryWorkerAtTheSameStep) {
  fs::path d = temp_dir("int");
  fs::path log = d / "out.txt";
  pid_t pid = start_job(d, log);
  ASSERT_GE(pid, 0);
  if (wait_training(pid, log, 1) <= 0) ::kill(pid, SIGKILL);
  ::kill(pid, SIGINT);
  int status = 0;
  ASSERT_TRUE(wait_job(pid, status)) << "weft run did not stop on SIGINT";
  std::string text = read_all(log);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  EXPECT_NE(text.find("[rank 0] interrupted: stopped cleanly after step"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("failed"), std::string::npos) << text;
  // The metrics end at a complete step: every line rank 0 wrote is a whole JSON object.
  EXPECT_FALSE(metrics_losses(d / "run" / "metrics.jsonl").empty());
  fs::remove_all(d);
}

// Without a launcher to stop them, the surviving ranks fail by themselves, naming the rank
// that died in the middle of a step.
TEST(PeerLoss, SurvivorsFailNamingTheLostRank) {
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"parallel.dp=2"},
        std::vector<std::string>{"parallel.dp=1", "parallel.pp=2"}}) {
    LayoutCase c{"gpt-layout.yaml", 2, layout, 4, 0};
    c.overrides.push_back("train.warmup_steps=1");
    core::JobSpec spec = layout_spec(c);
    core::data::TokenDataset data = core::data::TokenDataset::load(spec);
    RunResult r = run_ranks(2, [&](RankContext& ctx) {
      RankWorld world = gloo_world(ctx, "peer-loss", std::chrono::milliseconds(20'000));
      parallel::ParallelTrainer pt(spec, *world.comm);
      auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
        if (s == 2 && ctx.rank() == 1) ::kill(::getpid(), SIGKILL);  // dies mid-step
        data.fill_train(s, b0, n, x, y);
      };
      pt.step(batch);
      pt.step(batch);
      try {
        pt.step(batch);
        ADD_FAILURE() << "step 2 completed without rank 1";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
      }
    });
    ASSERT_EQ(r.ranks.size(), 2u);
    EXPECT_TRUE(r.ranks[0].ok()) << r.summary();
    EXPECT_EQ(r.ranks[1].status, RankStatus::kSignaled) << r.summary();
  }
}

}  // namespace
}  // namespace weft::test
