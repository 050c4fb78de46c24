// A run's history through the `weft` binary: a resume keeps the metrics of the steps before
// it (one process and two ranks), a new run never writes over another run's folder, and one
// process checks its layout the way several ranks do.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/io/metrics.h"
#include "tests/support/run_weft.h"

namespace {

namespace fs = std::filesystem;
using weft::test::CommandResult;
using weft::test::run_weft;
const std::string kConfig = std::string(WEFT_SOURCE_DIR) + "/configs/gpt-tiny.yaml";

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("weft_history_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// step -> the text of its training line (validation lines carry val_loss).
std::map<int64_t, std::string> step_lines(const fs::path& p) {
  std::map<int64_t, std::string> out;
  for (const std::string& l : lines_of(p)) {
    if (l.find("val_loss") != std::string::npos) continue;
    int64_t step = std::stoll(l.substr(l.find(':') + 1));
    EXPECT_EQ(out.count(step), 0u) << "step " << step << " appears twice in " << p;
    out[step] = l;
  }
  return out;
}

// The loss of each training line, by step.
std::map<int64_t, double> losses(const fs::path& p) {
  std::map<int64_t, double> out;
  for (const auto& row : weft::core::io::read_metrics(p.string()))
    if (!row.is_validation()) out[int64_t(row.at("step"))] = row.at("loss");
  return out;
}

std::string common(const fs::path& dir) {
  return "--config " + kConfig + " --set train.steps=8 --set train.warmup_steps=2 " +
         "--set train.eval_every=4 --set checkpoint.every=4 --set checkpoint.dir=" +
         (dir / "ckpt").string() + " --set train.out_dir=" + (dir / "run").string();
}

// Trains 8 steps (checkpoints at 4 and 8), then resumes the same run from step 4 with
// `launch` (empty: one process). Checks the history the resumed run leaves.
void expect_resume_keeps_history(const std::string& name, const std::string& launch) {
  fs::path dir = temp_dir(name);
  CommandResult first = run_weft(launch + "train " + common(dir));
  ASSERT_EQ(first.code, 0) << first.out;
  fs::path metrics = dir / "run" / "metrics.jsonl";
  std::map<int64_t, std::string> before = step_lines(metrics);
  std::map<int64_t, double> loss_before = losses(metrics);
  ASSERT_EQ(before.size(), 8u);

  CommandResult again =
      run_weft(launch + "train " + common(dir) + " --resume " + (dir / "ckpt" / "step-00000004").string());
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(again.out.find("holds an earlier run"), std::string::npos) << again.out;
  std::map<int64_t, std::string> after = step_lines(metrics);
  ASSERT_EQ(after.size(), 8u) << "every step 0..7 once";
  // Steps before the resume are the first run's lines, untouched; the rest were written again
  // and give the same numbers (a resume is exact).
  for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(after[s], before[s]) << "step " << s;
  std::map<int64_t, double> loss_after = losses(metrics);
  for (int64_t s = 4; s < 8; ++s) EXPECT_EQ(loss_after[s], loss_before[s]) << "step " << s;
  // Validation at steps 3 and 7, each once.
  int vals = 0;
  for (const auto& row : weft::core::io::read_metrics(metrics.string())) vals += row.is_validation();
  EXPECT_EQ(vals, 2);
  // The curve covers the whole run: it is drawn from the file, which now starts at step 0.
  EXPECT_TRUE(fs::exists(dir / "run" / "loss_curve.svg"));

  // Resuming the finished checkpoint trains nothing and keeps every line.
  CommandResult done = run_weft(launch + "train " + common(dir) + " --resume " + (dir / "ckpt").string());
  ASSERT_EQ(done.code, 0) << done.out;
  EXPECT_EQ(step_lines(metrics), after);
  // `weft run` prefixes its workers' lines once.
  EXPECT_EQ(first.out.find("[rank 0] [rank 0]"), std::string::npos) << first.out;
  fs::remove_all(dir);
}

TEST(RunHistory, ResumeKeepsTheStepsBeforeIt) { expect_resume_keeps_history("single", ""); }

TEST(RunHistory, ResumeOnTwoRanksKeepsTheStepsBeforeIt) {
  expect_resume_keeps_history("ranks", "run --standalone --nproc-per-node 2 -- weft ");
}

TEST(RunHistory, ANewRunGoesBesideAnEarlierOne) {
  fs::path dir = temp_dir("beside");
  std::string args = "train --config " + kConfig +
                     " --set train.steps=3 --set train.warmup_steps=1 --set train.out_dir=" +
                     (dir / "run").string();
  CommandResult a = run_weft(args);
  ASSERT_EQ(a.code, 0) << a.out;
  std::vector<std::string> first = lines_of(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(step_lines(dir / "run" / "metrics.jsonl").size(), 3u);
  CommandResult b = run_weft(args + " --set train.seed=7");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("this run writes " + (dir / "run-2").string()), std::string::npos) << b.out;
  EXPECT_EQ(lines_of(dir / "run" / "metrics.jsonl"), first) << "the earlier run is untouched";
  EXPECT_EQ(step_lines(dir / "run-2" / "metrics.jsonl").size(), 3u);
  EXPECT_NE(lines_of(dir / "run-2" / "metrics.jsonl"), first) << "another seed, other numbers";
  EXPECT_TRUE(fs::exists(dir / "run-2" / "loss_curve.svg"));
  // A third goes to run-3; an explicit --metrics file is the user's choice and is replaced.
  CommandResult c = run_weft(args);
  EXPECT_NE(c.out.find("this run writes " + (dir / "run-3").string()), std::string::npos) << c.out;
  CommandResult d = run_weft(args + " --metrics " + (dir / "run" / "metrics.jsonl").string());
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_NE(d.out.find("metrics: replacing"), std::string::npos) << d.out;
  fs::remove_all(dir);
}

TEST(RunHistory, OneProcessRefusesALayoutThatNeedsMoreRanks) {
  fs::path dir = temp_dir("layout");
  std::string base = "train --config " + kConfig +
                     " --set train.steps=2 --set train.warmup_steps=0 --set train.out_dir=" +
                     (dir / "run").string();
  for (const char* set_text :
       {"parallel.tp=2", "parallel.pp=2", "parallel.dp=4 --set train.global_batch=16"}) {
    const std::string set = set_text;
    CommandResult r = run_weft(base + " --set " + set);
    std::string field = set.substr(0, set.find('='));
    EXPECT_EQ(r.code, 2) << set << "\n" << r.out;
    EXPECT_NE(r.out.find("error: " + field + ":"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("launch with weft run --nproc-per-node"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "run" / "metrics.jsonl")) << set << ": nothing trained";
  }
  // plan: search fits one process: it searches the world it has and trains the best layout.
  CommandResult search = run_weft(base + " --set parallel.plan=search");
  EXPECT_EQ(search.code, 0) << search.out;
  EXPECT_NE(search.out.find("plan search: world 1"), std::string::npos) << search.out;
  // ZeRO over one data-parallel rank is exact (nothing to shard), and says so.
  CommandResult zero = run_weft(base + " --set parallel.zero=3");
  EXPECT_EQ(zero.code, 0) << zero.out;
  EXPECT_NE(zero.out.find("note: parallel.zero=3"), std::string::npos) << zero.out;
  fs::remove_all(dir);
}

}  // namespace
