// `weft train` when training goes non-finite, as a user meets it: lr=1e30 ends the run with
// exit 1 naming the step and the quantity and leaves only finite checkpoints; skip mode drops
// steps up to train.max_skipped; NaN --init-weights are refused (exit 2); the same through
// `weft run` on two ranks; SIGINT and SIGTERM save a final checkpoint.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "checkpoint/trainer_state.h"
#include "core/exec/nonfinite.h"
#include "core/io/metrics.h"
#include "tests/support/poison_safetensors.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
const std::string kWeft = WEFT_BINARY;
const std::string kTiny = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
const std::string kLayout = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path =
        fs::temp_directory_path() / ("weft_nonfinite_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

CommandResult weft(const std::string& args) {
  return run_command("OMP_NUM_THREADS=1 " + kWeft + " " + args);
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The gpt-tiny run that diverges: lr 1e30 applies step 0 (weights ~1e30, still finite) and
// step 1's forward overflows to NaN.
std::string diverging(const TempDir& d) {
  return "--config " + kTiny +
         " --set train.steps=6 --set train.warmup_steps=0 --set train.lr=1e30" +
         " --set train.log_every=1 --set train.eval_every=0 --set train.threads=1 --set "
         "train.out_dir=" +
         (d.path / "run").string();
}

// Loads every committed checkpoint under `root` into a trainer and checks each state tensor
// (parameters, moments, scalars) is finite; returns the steps found.
std::vector<int64_t> check_checkpoints_finite(const fs::path& root, const core::JobSpec& spec) {
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step-", 0) != 0) continue;
    core::Trainer t(spec);
    checkpoint::TrainerCheckpoints ck(spec, t, e.path().string());
    steps.push_back(t.current_step());
    for (const core::Tensor& x : checkpoint::trainer_tensors(t, ck.space()))
      EXPECT_TRUE(core::all_finite(x)) << n;
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

TEST(TrainNonfinite, StopNamesStepAndQuantityAndCheckpointsStayFinite) {
  TempDir d("stop");
  std::string ck = (d.path / "ckpt").string();
  CommandResult r = weft("train " + diverging(d) + " --set checkpoint.dir=" + ck +
                         " --set checkpoint.every=1 --set checkpoint.async=false");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("train: step 1: the loss is not finite (nan)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the step was not applied"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first non-finite gradient: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train.on_nonfinite: skip"), std::string::npos) << r.out;
  // Step 0 was written, step 1 (the stopped one) and later never were.
  core::JobSpec spec =
      core::load_job_spec(kTiny, {"train.steps=6", "train.warmup_steps=0", "train.lr=1e30",
                                  "train.eval_every=0", "train.threads=1", "checkpoint.dir=" + ck});
  EXPECT_EQ(check_checkpoints_finite(ck, spec), std::vector<int64_t>{1});
  // The metrics hold both steps; the dropped one says so, with its NaN loss as null.
  std::string text = read_all(d.path / "run" / "metrics.jsonl");
  EXPECT_NE(text.find("\"loss\": null"), std::string::npos) << text;
  auto rows = core::io::read_metrics((d.path / "run" / "metrics.jsonl").string());
  ASSERT_EQ(rows.size(), 2u) << text;
  EXPECT_FALSE(rows[0].get("skipped").has_value());
  EXPECT_EQ(rows[1].at("skipped"), 1.0);
  EXPECT_TRUE(std::isnan(rows[1].at("loss")));
}

TEST(TrainNonfinite, SkipDropsStepsUntilMaxSkippedInARow) {
  TempDir d("skip");
  CommandResult r =
      weft("train " + diverging(d) + " --set train.on_nonfinite=skip --set train.max_skipped=3");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("step 1/6 | skipped: loss nan (1 in a row, train.max_skipped 3)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("step 2/6 | skipped: loss nan (2 in a row, train.max_skipped 3)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("train: step 3: the loss is not finite (nan)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the limit of train.max_skipped (3)"), std::string::npos) << r.out;
  auto rows = core::io::read_metrics((d.path / "run" / "metrics.jsonl").string());
  ASSERT_EQ(rows.size(), 4u);
  for (size_t s = 1; s < 4; ++s) EXPECT_EQ(rows[s].at("skipped"), 1.0) << "step " << s;
}

TEST(TrainNonfinite, InitWeightsWithNaNOrInfAreRefusedNamingTheTensor) {
  TempDir d("init");
  fs::path w = d.path / "w.safetensors";
  std::string base = "--config " + kTiny +
                     " --set train.steps=1 --set train.warmup_steps=0 --set train.eval_every=0 " +
                     "--set train.out_dir=" + (d.path / "run").string();
  ASSERT_EQ(weft("train " + base + " --save-weights " + w.string()).code, 0);
  ASSERT_EQ(weft("train " + base + " --init-weights " + w.string()).code, 0);  // the file is fine
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    weft::test::poison_safetensors(w, "h.0.attn.qkv.weight", bad);
    CommandResult r = weft("train " + base + " --init-weights " + w.string());
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("--init-weights"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("'h.0.attn.qkv.weight' holds NaN or Inf"), std::string::npos) << r.out;
  }
}

// ---- several ranks through `weft run` ----------------------------------------------------

std::string two_ranks(const TempDir& d, const std::string& layout) {
  return "run --standalone --nproc-per-node 2 -- weft train --config " + kLayout +
         " --set train.steps=6 --set train.warmup_steps=0 --set train.lr=1e30 " +
         "--set train.log_every=1 --set train.eval_every=0 " + layout +
         " --set train.out_dir=" + (d.path / "run").string();
}

TEST(TrainNonfinite, TwoRanksStopAtTheSameStepNamingIt) {
  for (std::string layout : {"--set parallel.dp=2", "--set parallel.dp=1 --set parallel.pp=2",
                             "--set parallel.dp=2 --set parallel.zero=1"}) {
    TempDir d("ranks");
    CommandResult r = weft(two_ranks(d, layout));
    EXPECT_EQ(r.code, 1) << layout << "\n" << r.out;
    EXPECT_NE(r.out.find("failed: train: step 1: the loss is not finite (nan)"), std::string::npos)
        << layout << "\n"
        << r.out;
    EXPECT_NE(r.out.find("first non-finite gradient: "), std::string::npos) << r.out;
    // Rank 0's step line shows its activation memory, as one process's does.
    EXPECT_NE(r.out.find("MiB |"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step     1/6 | loss"), std::string::npos) << r.out;
  }
}

// ---- signals -----------------------------------------------------------------------------

// Waits for `text` in the log (at most 120 s); then sends `sig` and waits for the exit (at
// most 120 s more; SIGKILL after). Returns the wait status; -1 when it had to be killed.
int signal_after(pid_t pid, const fs::path& log, const std::string& text, int sig) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (read_all(log).find(text) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(pid, sig);
  int status = 0;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return status;
}

void expect_final_checkpoint(const std::string& out, const fs::path& ck) {
  size_t at = out.find("interrupted: stopped cleanly after step ");
  ASSERT_NE(at, std::string::npos) << out;
  long long last =
      std::stoll(out.substr(at + std::strlen("interrupted: stopped cleanly after step ")));
  char folder[32];
  std::snprintf(folder, sizeof folder, "step-%08lld", last + 1);
  EXPECT_NE(out.find("interrupted: saved checkpoint"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(ck / folder)) << folder << "\n" << out;
  CommandResult v = weft("ckpt verify " + (ck / folder).string());
  EXPECT_EQ(v.code, 0) << v.out;
}

TEST(TrainNonfinite, SigintAndSigtermSaveAFinalCheckpoint) {
  for (int sig : {SIGINT, SIGTERM}) {
    TempDir d(sig == SIGINT ? "int" : "term");
    fs::path ck = d.path / "ckpt", log = d.path / "out.txt";
    pid_t pid = weft::test::start_weft(
        {"train", "--config", kTiny, "--set", "train.steps=100000", "--set", "train.log_every=1",
         "--set", "train.eval_every=0", "--set", "checkpoint.dir=" + ck.string(), "--set",
         "checkpoint.every=100000", "--set", "train.out_dir=" + (d.path / "run").string()},
        log);
    ASSERT_GT(pid, 0);
    int status = signal_after(pid, log, "| loss", sig);
    std::string out = read_all(log);
    ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 130) << out;
    expect_final_checkpoint(out, ck);
  }
}

TEST(TrainNonfinite, CtrlCOnTwoRanksSavesAFinalCheckpoint) {
  TempDir d("ranks_int");
  fs::path ck = d.path / "ckpt", log = d.path / "out.txt";
  pid_t pid = weft::test::start_weft({"run",
                                      "--standalone",
                                      "--nproc-per-node",
                                      "2",
                                      "--",
                                      "weft",
                                      "train",
                                      "--config",
                                      kLayout,
                                      "--set",
                                      "parallel.dp=2",
                                      "--set",
                                      "train.steps=100000",
                                      "--set",
                                      "train.log_every=1",
                                      "--set",
                                      "train.eval_every=0",
                                      "--set",
                                      "checkpoint.dir=" + ck.string(),
                                      "--set",
                                      "checkpoint.every=100000",
                                      "--set",
                                      "train.out_dir=" + (d.path / "run").string()},
                                     log);
  ASSERT_GT(pid, 0);
  int status = signal_after(pid, log, "| loss", SIGINT);
  std::string out = read_all(log);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 130) << out;
  expect_final_checkpoint(out, ck);
}

}  // namespace
}  // namespace weft::test
