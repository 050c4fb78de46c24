// A world resumed right after a step whose lead never wrote its metrics line (torn by a
// collective after every rank agreed the step's statistics, or lost, while a peer finished
// the step): the new lead appends the line some rank kept, once, and only for that step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/io/metrics.h"
#include "launch/run_folder.h"

namespace weft::launch {
namespace {

namespace fs = std::filesystem;

core::io::StepMetrics line_of(int64_t step, double loss) {
  core::io::StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.world = 3;
  m.extra = {{"torn", 1}};
  return m;
}

std::vector<int64_t> steps_in(const std::string& path) {
  std::vector<int64_t> out;
  for (const core::io::MetricsRow& r : core::io::read_metrics(path))
    if (!r.is_validation()) out.push_back(int64_t(r.at("step")));
  return out;
}

class AgreedLine : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("weft_agreed_line_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    folder_.out = dir_.string();
    folder_.metrics_path = (dir_ / "metrics.jsonl").string();
    auto w = open_metrics(folder_, std::nullopt);
    for (int64_t s = 0; s < 29; ++s) w->write_step(line_of(s, 10.0 - 0.1 * double(s)));
    w->write_validation(28, 7.5);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  RunFolder folder_;
};

TEST_F(AgreedLine, AResumeAfterTheStepWritesItsMissingLineOnce) {
  auto w = open_metrics(folder_, int64_t(30));  // a peer finished step 29; the lead did not
  EXPECT_TRUE(append_agreed_line(*w, line_of(29, 7.1), 30));
  EXPECT_FALSE(append_agreed_line(*w, line_of(29, 7.1), 30)) << "written twice";
  std::vector<int64_t> want;
  for (int64_t s = 0; s < 30; ++s) want.push_back(s);
  EXPECT_EQ(steps_in(folder_.metrics_path), want);
  const core::io::MetricsRow last = core::io::read_metrics(folder_.metrics_path).back();
  EXPECT_DOUBLE_EQ(last.at("loss"), 7.1);
  EXPECT_DOUBLE_EQ(last.at("torn"), 1);
}

TEST_F(AgreedLine, AValidationLineOfTheStepIsNotItsTrainingLine) {
  {
    auto w = open_metrics(folder_, int64_t(28));  // lines 0..27 kept
    w->write_validation(28, 7.5);                 // a validation line of step 28 alone
  }
  auto w = open_metrics(folder_, int64_t(29));
  EXPECT_TRUE(append_agreed_line(*w, line_of(28, 7.2), 29));
  EXPECT_EQ(steps_in(folder_.metrics_path).back(), 28);
  EXPECT_EQ(steps_in(folder_.metrics_path).size(), 29u);
}

TEST_F(AgreedLine, AResumeAtOrBeforeTheStepWritesNothing) {
  // Resumed at step 29 (every rank went back to the step's start): the step is redone and
  // gets its line then; a line kept of it now would come twice.
  auto w = open_metrics(folder_, int64_t(29));
  EXPECT_FALSE(append_agreed_line(*w, line_of(29, 7.1), 29));
  // Resumed further back (a snapshot of step 20): the lines from 20 on are dropped and
  // redone; nothing is written ahead of them.
  auto back = open_metrics(folder_, int64_t(20));
  EXPECT_FALSE(append_agreed_line(*back, line_of(29, 7.1), 20));
  EXPECT_EQ(steps_in(folder_.metrics_path).size(), 20u);
}

}  // namespace
}  // namespace weft::launch
