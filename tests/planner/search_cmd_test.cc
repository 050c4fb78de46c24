// The plan search as a user meets it: `weft plan` prints the candidates and plans the best,
// --compare-megatron prints the ratio, a cap nothing fits exits 2 naming memory.limit_gib, and
// `weft train` with parallel.plan: search trains on two ranks under `weft run`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/run_weft.h"

namespace weft::planner {
namespace {

using CmdResult = test::CommandResult;
std::string config(const std::string& name) {
  return std::string(WEFT_SOURCE_DIR) + "/configs/" + name;
}
const std::string kFreeAll =
    " --set parallel.plan=search --set parallel.tp=auto --set parallel.pp=auto --set "
    "parallel.zero=auto"
    " --set parallel.recompute=auto --set parallel.pipeline.schedule=auto"
    " --set parallel.pipeline.micro_batches=auto --set train.micro_batch=auto"
    " --set parallel.pipeline.layout=auto --set parallel.pipeline.virtual_stages=auto";

TEST(SearchCmd, PlanPrintsTheCandidatesThenPlansTheBest) {
  CmdResult r =
      test::run_weft("plan --config " + config("gpt2-124m-plan.yaml") + " --world 8" + kFreeAll);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("plan search: world 8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<- chosen"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GiB/rank"), std::string::npos) << r.out;
  // Then the chosen layout's plan, as without the search.
  EXPECT_NE(r.out.find("predicted step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("planned in"), std::string::npos) << r.out;
  // Keys the file fixes stay fixed: its tp 2 and micro_batch 4.
  r = test::run_weft("plan --config " + config("gpt2-124m-plan.yaml") +
                     " --world 8 --set parallel.plan=search");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("x 2 x 2 x 1      1f1b              4     1 none"), std::string::npos)
      << r.out;
}

TEST(SearchCmd, CompareMegatronPrintsBothAndTheRatio) {
  CmdResult r = test::run_weft("plan --config " + config("llama3-70b-like.yaml") +
                               " --world 1024 --compare-megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("searched    "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Megatron    "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x 8 x "), std::string::npos) << r.out;  // Megatron's tp = a node
  EXPECT_NE(r.out.find("searched / Megatron-style: "), std::string::npos) << r.out;
}

TEST(SearchCmd, NothingFitsExitsTwoNamingTheCap) {
  CmdResult r = test::run_weft("plan --config " + config("gpt3-175b-like.yaml") +
                               " --world 64 --set memory.limit_gib=4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("memory.limit_gib"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the smallest of"), std::string::npos) << r.out;
}

TEST(SearchCmd, TrainsTheSearchedLayoutOnTwoRanks) {
  namespace fs = std::filesystem;
  const fs::path out =
      fs::temp_directory_path() / ("weft_search_train_" + std::to_string(::getpid()));
  fs::remove_all(out);
  CmdResult r = test::run_command("OMP_NUM_THREADS=1 " + std::string(WEFT_BINARY) +
                                  " run --standalone --nproc-per-node 2 -- " + WEFT_BINARY +
                                  " train --config " + config("gpt-tiny.yaml") +
                                  " --set parallel.plan=search --set train.steps=3 --set "
                                  "train.eval_every=0 --set train.threads=1" +
                                  " --set train.out_dir=" + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("plan search: world 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<- chosen"), std::string::npos) << r.out;
  // Only rank 0 prints the table.
  EXPECT_EQ(r.out.find("[rank 1] plan search"), std::string::npos) << r.out;
  std::ifstream metrics(out / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);)
    lines += line.find("\"loss\"") != std::string::npos;
  EXPECT_EQ(lines, 3) << r.out;
  fs::remove_all(out);
}

}  // namespace
}  // namespace weft::planner
