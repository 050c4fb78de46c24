// `weft plan` end to end: the shipped planning configs plan, validate and print at several
// world sizes; bad input exits 2 naming the field; --json and --timeline write their files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "planner/plan_json.h"
#include "tests/support/run_weft.h"

namespace weft::planner {
namespace {

using CmdResult = test::CommandResult;
CmdResult run(const std::string& args) { return test::run_weft("plan " + args); }

std::string config(const std::string& name) { return std::string(WEFT_SOURCE_DIR) + "/configs/" + name; }

class CmdPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(WEFT_BINARY)) << WEFT_BINARY << " is built with every test";
  }
};

TEST_F(CmdPlan, PrintsLayoutPlacementAndCosts) {
  for (int world : {8, 64}) {
    CmdResult r = run("--config " + config("gpt2-124m-plan.yaml") + " --world " + std::to_string(world));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("stage 0: embedding, layers 0-5"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("stage 1: layers 6-11, final norm + head"), std::string::npos);
    EXPECT_NE(r.out.find("predicted step"), std::string::npos);
    EXPECT_NE(r.out.find("planned in"), std::string::npos);
  }
}

TEST_F(CmdPlan, SevenBillionAtFiveHundredTwelveRanks) {
  CmdResult r = run("--config " + config("llama3-8b-like.yaml") + " --world 512");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("world 512 = dp 64 x tp 4 x pp 2 x ep 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ranks 0,4,8,...,252 (64 ranks)"), std::string::npos) << r.out;
}

TEST_F(CmdPlan, BadParallelValuesExitTwoNamingTheField) {
  CmdResult r = run("--config " + config("gpt2-124m-plan.yaml") + " --world 8 --set parallel.tp=5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("parallel.tp"), std::string::npos) << r.out;
  r = run("--config " + config("llama3-8b-like.yaml") + " --world 6");
  EXPECT_EQ(r.code, 2);
  r = run("--config " + config("gpt2-124m-plan.yaml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--world"), std::string::npos);
}

// GPT-2's unpadded vocabulary under tp=2: balanced slices of 25129 and 25128 rows.
TEST_F(CmdPlan, UnpaddedGpt2VocabularySplitsUnevenly) {
  CmdResult r =
      run("--config " + config("gpt2-124m-plan.yaml") + " --world 8 --set model.vocab=50257");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("wte.weight rows 0-25128 of 50257"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("wte.weight rows 25129-50256 of 50257"), std::string::npos) << r.out;
}

TEST_F(CmdPlan, WritesJsonAndTimeline) {
  std::string dir = ::testing::TempDir();
  std::string json = dir + "/weft_cmd_plan.json", svg = dir + "/weft_cmd_plan.svg";
  CmdResult r = run("--config " + config("gpt2-124m-plan.yaml") + " --world 8 --set train.global_batch=64 --out " +
              json + " --timeline " + svg);
  ASSERT_EQ(r.code, 0) << r.out;
  Plan p = read_plan_file(json);
  EXPECT_EQ(p.world(), 8);
  EXPECT_TRUE(p.costs.valid);
  std::ifstream f(svg);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("<svg"), std::string::npos);
  EXPECT_NE(ss.str().find("rank 7"), std::string::npos);
  std::remove(json.c_str());
  std::remove(svg.c_str());
}

}  // namespace
}  // namespace weft::planner
