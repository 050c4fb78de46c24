// weft run's scratch folder (launch/scratch_dir.h): a SIGKILLed weft run cannot remove its
// own, so the next one removes every scratch folder whose owner is gone, and only those.
#include "launch/scratch_dir.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace weft::launch {
namespace {

namespace fs = std::filesystem;

// A pid that was a process and is no longer one (a child that exited and was reaped).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(ScratchDir, RemovesTheFoldersOfGoneOwnersOnlyAndItsOwnAtTheEnd) {
  const fs::path dir =
      fs::temp_directory_path() / ("weft_scratch_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string gone = "weft_run_" + std::to_string(dead_pid()) + "_AbC123";
  const std::string alive = "weft_run_" + std::to_string(::getpid()) + "_XyZ789";
  const std::string init = "weft_run_1_QwErTy";     // pid 1 is always a process
  const std::string logs = "weft_run_logs_Q1w2E3";  // a user's log folder: kept
  const std::string old_style = "weft_run_zvWwKw";  // no owner in the name: kept
  for (const std::string& n : {gone, alive, init, logs, old_style})
    fs::create_directories(dir / n / "attempt_0" / "rank_0");
  EXPECT_EQ(ScratchDir::remove_abandoned(dir.string()), 1);
  EXPECT_FALSE(fs::exists(dir / gone));
  for (const std::string& n : {alive, init, logs, old_style}) EXPECT_TRUE(fs::exists(dir / n)) << n;
  EXPECT_EQ(ScratchDir::remove_abandoned(dir.string()), 0);
  fs::remove_all(dir);

  std::string made;
  {
    ScratchDir s;
    made = s.path();
    EXPECT_TRUE(fs::is_directory(made));
    EXPECT_EQ(
        fs::path(made).filename().string().rfind("weft_run_" + std::to_string(::getpid()) + "_", 0),
        0u)
        << made;
  }
  EXPECT_FALSE(fs::exists(made));
}

}  // namespace
}  // namespace weft::launch
