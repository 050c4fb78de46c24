// A world resumed right after a step whose lead never wrote its metrics line (torn by a
// collective after every rank agreed the step's statistics, or lost, while a peer finished
// the step): the new lead appends the line some rank kept, once, and only for that step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/store/tcp_store_server.h"
#include "core/io/metrics.h"
#include "launch/run_folder.h"
#include "parallel/launch_env.h"
#include "tests/launch/world_threads.h"

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

// The kept line travels as text and comes back bit for bit (values no decimal text of
// default precision keeps: a third, a tenth, a denormal).
TEST(AgreedLineText, ALineComesBackExactly) {
  core::io::StepMetrics m;
  m.step = 137, m.loss = 1.0 / 3, m.lr = 7.6883544149242652e-04, m.grad_norm = 0.1;
  m.tokens_per_s = 0, m.world = 3, m.epoch = 20, m.data_epoch = 2;
  m.extra = {{"aux_loss", 4.9e-324}, {"step_ms", 20.4}, {"torn", 1}};
  const core::io::StepMetrics back = parse_step_line(format_step_line(m));
  EXPECT_EQ(back.step, m.step);
  EXPECT_EQ(back.loss, m.loss);
  EXPECT_EQ(back.lr, m.lr);
  EXPECT_EQ(back.grad_norm, m.grad_norm);
  EXPECT_EQ(back.tokens_per_s, m.tokens_per_s);
  EXPECT_EQ(back.world, m.world);
  EXPECT_EQ(back.epoch, m.epoch);
  EXPECT_EQ(back.data_epoch, m.data_epoch);
  EXPECT_EQ(back.extra, m.extra);
  EXPECT_THROW(parse_step_line("137 0x1p-2"), InternalError);
}

// Three ranks of a new world as threads: which line the lead ends up with. The case that
// needs it: the lead failed the step's statistics exchange (a peer died mid all-gather)
// while another rank completed it and finished the step, so the world resumes after a step
// the lead knows nothing of (LiveResizeSoak lost step 137's line so once).
class ShareAgreedLine : public ::testing::Test {
 protected:
  // kept[r]: rank r's kept line (a step and a loss that names the rank), or none.
  std::vector<std::optional<core::io::StepMetrics>> run(
      const std::vector<std::optional<core::io::StepMetrics>>& kept, int64_t step) {
    std::vector<std::optional<core::io::StepMetrics>> out(kept.size());
    const std::vector<std::string> errors =
        run_world_threads(int(kept.size()), 4, [&](int rank, comm::Communicator& world) {
          out[size_t(rank)] = share_agreed_line(world, kept[size_t(rank)], step);
        });
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    return out;
  }
  static core::io::StepMetrics kept(int64_t step, double loss) {
    core::io::StepMetrics m;
    m.step = step, m.loss = loss, m.world = 3, m.epoch = 20;
    m.extra = {{"step_ms", 20.4}};
    return m;
  }
};

TEST_F(ShareAgreedLine, ALeadWithoutTheStepTakesItFromTheLowestRankThatKeptIt) {
  // Rank 0 kept step 136 (its last), ranks 1 and 2 finished 137.
  auto out = run({kept(136, 0.5), kept(137, 1.0 / 3), kept(137, 0.25)}, 137);
  ASSERT_TRUE(out[0].has_value());
  EXPECT_EQ(out[0]->step, 137);
  EXPECT_EQ(out[0]->loss, 1.0 / 3);  // rank 1's, bit for bit
  EXPECT_EQ(out[0]->extra, kept(137, 0).extra);
  EXPECT_EQ(out[1]->loss, 1.0 / 3);  // the others keep their own
  EXPECT_EQ(out[2]->loss, 0.25);
}

TEST_F(ShareAgreedLine, ALeadThatKeptTheStepKeepsItsOwnAndNobodysLineIsNone) {
  auto own = run({kept(137, 0.75), kept(137, 1.0 / 3), std::nullopt}, 137);
  ASSERT_TRUE(own[0].has_value());
  EXPECT_EQ(own[0]->loss, 0.75);
  // Nobody kept step 137 (every rank was torn before the agreement): the lead keeps what it
  // had, which append_agreed_line will not write for this resume.
  auto none = run({kept(136, 0.5), std::nullopt, kept(135, 0.25)}, 137);
  ASSERT_TRUE(none[0].has_value());
  EXPECT_EQ(none[0]->step, 136);
  EXPECT_FALSE(none[1].has_value());
}

}  // namespace
}  // namespace weft::launch
