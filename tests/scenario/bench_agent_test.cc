// The benches' handle on a `weft run` they start and kill (launch/bench_elastic_agent.h): once
// reaped, the run leaves no scratch folder (launch/scratch_dir.h) under $TMPDIR, whether the
// bench SIGKILLed it and pumped until it ended (a node's death) or dropped the handle while it
// ran (the bench's end).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "launch/bench_elastic_agent.h"
#include "tests/support/eventually.h"

namespace weft::launch {
namespace {

namespace fs = std::filesystem;

// The scratch folders of the weft run `pid` under the temporary directory.
std::vector<fs::path> scratch_of(pid_t pid) {
  const std::string prefix = "weft_run_" + std::to_string(pid) + "_";
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
    if (e.path().filename().string().starts_with(prefix)) found.push_back(e.path());
  return found;
}

class BenchAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("weft_bench_agent_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A one-worker weft run whose worker sleeps; its scratch folder made before the return.
  std::unique_ptr<BenchAgent> start(const std::string& name) {
    auto a = std::make_unique<BenchAgent>(
        std::vector<std::string>{WEFT_BINARY, "run", "--standalone", "--nproc-per-node", "1", "--",
                                 "/bin/sleep", "60"},
        (dir_ / (name + ".log")).string(), BenchAgent::Clock::now());
    EXPECT_TRUE(test::eventually([&] {
      a->pump();
      return !scratch_of(a->pid()).empty() || !a->running();
    }));
    return a;
  }

  fs::path dir_;
};

TEST_F(BenchAgentTest, AKilledRunsScratchFolderIsGoneOnceReaped) {
  std::unique_ptr<BenchAgent> a = start("killed");
  const pid_t pid = a->pid();
  ASSERT_TRUE(a->running()) << "weft run ended before it was killed: see " << dir_;
  ASSERT_EQ(scratch_of(pid).size(), 1u);
  a->kill();
  ASSERT_TRUE(test::eventually([&] {
    a->pump();
    return !a->running();
  }));
  EXPECT_EQ(a->exit_code(), 128 + SIGKILL);
  const std::vector<fs::path> left = scratch_of(pid);
  EXPECT_TRUE(left.empty()) << left.front();
}

TEST_F(BenchAgentTest, ARunDroppedWhileRunningLeavesNoScratchFolder) {
  std::unique_ptr<BenchAgent> a = start("dropped");
  const pid_t pid = a->pid();
  ASSERT_TRUE(a->running()) << "weft run ended before it was dropped: see " << dir_;
  ASSERT_EQ(scratch_of(pid).size(), 1u);
  a.reset();  // SIGKILL and reap
  const std::vector<fs::path> left = scratch_of(pid);
  EXPECT_TRUE(left.empty()) << left.front();
}

}  // namespace
}  // namespace weft::launch
