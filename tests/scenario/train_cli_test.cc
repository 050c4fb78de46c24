// `weft train` end to end: the progress lines, the run folder, exit codes for bad input,
// and a clean stop on Ctrl-C.
#include <gtest/gtest.h>

#include "tests/support/run_weft.h"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/io/metrics.h"

namespace {

namespace fs = std::filesystem;
const std::string kWeft = WEFT_BINARY;
const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml";

using Result = weft::test::CommandResult;
Result run(const std::string& args) { return weft::test::run_weft(args); }

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("weft_cli_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(TrainCli, TrainsAndWritesTheRunFolder) {
  fs::path out = temp_dir("train");
  Result r = run("train --config " + kConfig + " --set train.steps=6 --set train.warmup_steps=2 " +
                 "--set train.eval_every=3 " +
                 "--set train.log_every=1 --set train.out_dir=" + out.string() +
                 " --save-weights " + (out / "w.safetensors").string());
  ASSERT_EQ(r.code, 0) << r.out;
  // A progress line per step, validation lines, the final table.
  for (int s = 0; s < 6; ++s)
    EXPECT_NE(r.out.find("step " + std::string(s < 10 ? "    " : "   ") + std::to_string(s) + "/6 | loss"),
              std::string::npos) << r.out;
  EXPECT_NE(r.out.find("val_loss"), std::string::npos);
  EXPECT_NE(r.out.find("== loss curve =="), std::string::npos);
  auto rows = weft::core::io::read_metrics((out / "metrics.jsonl").string());
  int steps = 0, vals = 0;
  for (const auto& row : rows) (row.is_validation() ? vals : steps)++;
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(vals, 2);
  EXPECT_TRUE(fs::exists(out / "loss_curve.svg"));
  EXPECT_TRUE(fs::exists(out / "config.yaml"));
  EXPECT_TRUE(fs::exists(out / "w.safetensors"));
  // The saved weights load back as initial weights of the same model.
  Result again = run("train --config " + kConfig + " --set train.steps=1 --set train.warmup_steps=0 " +
                     "--set train.out_dir=" +
                     out.string() + "/again --init-weights " + (out / "w.safetensors").string());
  EXPECT_EQ(again.code, 0) << again.out;
  fs::remove_all(out);
}

TEST(TrainCli, BadInputExitsWithTwoAndNamesTheField) {
  Result unknown = run("train --config " + kConfig + " --set train.lrr=0.1");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.out.find("train.lrr"), std::string::npos) << unknown.out;
  Result type = run("train --config " + kConfig + " --set train.lr=abc");
  EXPECT_EQ(type.code, 2);
  EXPECT_NE(type.out.find("train.lr"), std::string::npos) << type.out;
  Result missing = run("train --config /nonexistent/x.yaml");
  EXPECT_EQ(missing.code, 2);
  Result data = run("train --config " + kConfig + " --set data.path=/nonexistent.bin");
  EXPECT_EQ(data.code, 2);
  EXPECT_NE(data.out.find("data.path"), std::string::npos) << data.out;
  Result weights = run("train --config " + kConfig + " --init-weights " +
                       std::string(WEFT_REFERENCE_DIR) + "/moe-tiny/init.safetensors");
  if (fs::exists(std::string(WEFT_REFERENCE_DIR) + "/moe-tiny/init.safetensors")) {
    EXPECT_EQ(weights.code, 2);
    EXPECT_NE(weights.out.find("--init-weights"), std::string::npos) << weights.out;
  }
  Result option = run("train --config " + kConfig + " --bogus 1");
  EXPECT_EQ(option.code, 2);
  EXPECT_NE(option.out.find("--bogus"), std::string::npos);
}

TEST(TrainCli, CtrlCStopsCleanlyAfterTheCurrentStep) {
  fs::path out = temp_dir("sigint");
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::close(pipefd[0]);
    std::string outdir = "train.out_dir=" + out.string();
    ::execl(kWeft.c_str(), kWeft.c_str(), "train", "--config", kConfig.c_str(), "--set",
            "train.steps=100000", "--set", outdir.c_str(), "--set", "train.log_every=1",
            (char*)nullptr);
    ::_exit(127);
  }
  ::close(pipefd[1]);
  // Wait for the first progress line, then interrupt.
  std::string seen;
  char c;
  while (seen.find("| loss") == std::string::npos && ::read(pipefd[0], &c, 1) == 1) seen += c;
  ::kill(pid, SIGINT);
  while (::read(pipefd[0], &c, 1) == 1) seen += c;
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << seen;
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_NE(seen.find("interrupted: stopped cleanly"), std::string::npos) << seen;
  // Every finished step is in the metrics, and the run folder is complete.
  auto rows = weft::core::io::read_metrics((out / "metrics.jsonl").string());
  EXPECT_GE(rows.size(), 1u);
  EXPECT_TRUE(fs::exists(out / "loss_curve.svg"));
  fs::remove_all(out);
}

}  // namespace
