// `weft bench train` end to end on one step: a row per (config, threads) in the table's
// shape, Weft's side always, PyTorch's where python3 imports torch, the Llama row (LS) among
// them. Behaviour and output shape, never timing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/run_weft.h"

namespace {

using Result = weft::test::CommandResult;

// A table row "cfg thr | weft torch ratio | GFLOP/s %peak | weft MiB torch MiB | gemm attn rest"
// read back as its numbers; empty when there is no row for (cfg, thr).
struct Row {
  double weft = 0, torch = 0, ratio = 0, gflops = 0, peak = 0, weft_mib = 0, torch_mib = 0;
  double gemm = 0, attn = 0, rest = 0;
  bool found = false;
};

Row find_row(const std::string& out, const std::string& cfg, const std::string& thr) {
  std::stringstream ss(out);
  for (std::string line; std::getline(ss, line);) {
    std::stringstream ls(line);
    std::vector<std::string> tok;
    for (std::string t; ls >> t;) tok.push_back(t);
    if (tok.size() != 16 || tok[0] != cfg || tok[1] != thr || tok[2] != "|" || tok[6] != "|" ||
        tok[9] != "|" || tok[12] != "|")
      continue;
    auto pct = [](std::string s) {
      if (!s.empty() && s.back() == '%') s.pop_back();
      return std::stod(s);
    };
    Row r;
    r.found = true;
    r.weft = std::stod(tok[3]);
    r.torch = std::stod(tok[4]);
    r.ratio = std::stod(tok[5]);
    r.gflops = std::stod(tok[7]);
    r.peak = pct(tok[8]);
    r.weft_mib = std::stod(tok[10]);
    r.torch_mib = std::stod(tok[11]);
    r.gemm = pct(tok[13]);
    r.attn = pct(tok[14]);
    r.rest = pct(tok[15]);
    return r;
  }
  return {};
}

bool python_has_torch() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

TEST(BenchTrain, WeftOnlyPrintsAGptAndALlamaRow) {
  Result r = weft::test::run_weft(
      "bench train --configs S,LS --threads 1 --steps 1 --repeat 2 --no-torch");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--no-torch: Weft only"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("each side the best of 2 runs"), std::string::npos) << r.out;
  for (const char* cfg : {"S", "LS"}) {
    Row row = find_row(r.out, cfg, "1");
    ASSERT_TRUE(row.found) << cfg << "\n" << r.out;
    EXPECT_GT(row.weft, 0.0) << cfg << "\n" << r.out;
    EXPECT_GT(row.gflops, 0.0) << cfg << "\n" << r.out;
    EXPECT_GT(row.weft_mib, 0.0) << cfg << "\n" << r.out;
    EXPECT_EQ(row.torch, 0.0) << cfg << "\n" << r.out;  // no PyTorch side asked for
    EXPECT_EQ(row.ratio, 0.0) << cfg << "\n" << r.out;
    // The shares of Weft's kernel time cover it (rounded to whole percents).
    EXPECT_NEAR(row.gemm + row.attn + row.rest, 100.0, 2.0) << cfg << "\n" << r.out;
    // Llama's grouped-query attention counts as attention, as GPT's does.
    EXPECT_GT(row.attn, 0.0) << cfg << "\n" << r.out;
  }
  EXPECT_FALSE(find_row(r.out, "M", "1").found) << r.out;  // only the configs asked for
}

TEST(BenchTrain, LlamaRowHasPyTorchSideAndRatio) {
  if (!python_has_torch()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch (python3-torch)";
  Result r = weft::test::run_weft("bench train --configs LS --threads 1 --steps 1");
  ASSERT_EQ(r.code, 0) << r.out;
  Row row = find_row(r.out, "LS", "1");
  ASSERT_TRUE(row.found) << r.out;
  EXPECT_GT(row.weft, 0.0) << r.out;
  EXPECT_GT(row.torch, 0.0) << r.out;
  EXPECT_GT(row.torch_mib, 0.0) << r.out;
  // The ratio is the two printed rates' (each rounded to a whole token/s, the ratio to 0.01).
  EXPECT_NEAR(row.ratio, row.weft / row.torch, 0.01 + 2.0 / row.torch) << r.out;
}

TEST(BenchTrain, UnknownConfigIsRefusedNamingTheChoices) {
  Result r = weft::test::run_weft("bench train --configs S,XL --no-torch");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--configs: unknown config 'XL'; expected one of: S, M, LS"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("weft tok/s"), std::string::npos) << "refused before measuring\n" << r.out;

  r = weft::test::run_weft("bench train --configs LS --repeat 0 --no-torch");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--repeat: expected an integer in [1, 100], got 0"), std::string::npos)
      << r.out;
}

}  // namespace
