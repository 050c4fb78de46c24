// A Llama checkpoint on the command line: trained from the reference's init.safetensors,
// `weft ckpt export` writes exactly the names and shapes of that file (LlamaForCausalLM's),
// with the bytes --save-weights writes, and `--init-weights` refuses a GPT weights file.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/io/safetensors.h"
#include "tests/checkpoint/ckpt_util.h"
#include "tests/support/reference.h"
#include "tests/support/run_weft.h"

namespace weft::checkpoint {
namespace {

using test_util::TempDir;

TEST(LlamaCkptCli, ExportHasHuggingFaceNamesAndShapes) {
  const std::string ref = std::string(WEFT_REFERENCE_DIR) + "/llama-tiny";
  WEFT_REQUIRE_REFERENCE(ref);
  ASSERT_TRUE(std::filesystem::exists(WEFT_BINARY)) << WEFT_BINARY << " is built with every test";
  TempDir d;
  const std::string ck = d.str() + "/ckpt";
  auto r = ::weft::test::run_weft("train --config " + ref + "/config.yaml --init-weights " + ref +
                                  "/init.safetensors --set train.steps=3 --set train.threads=1 " +
                                  "--set train.out_dir=" + d.str() + "/run --set checkpoint.dir=" + ck +
                                  " --set checkpoint.every=3 --set checkpoint.async=false --save-weights " +
                                  d.str() + "/saved.safetensors");
  ASSERT_EQ(r.code, 0) << r.out;
  auto ex = ::weft::test::run_weft("ckpt export " + ck + " " + d.str() + "/export.safetensors");
  ASSERT_EQ(ex.code, 0) << ex.out;
  auto init = core::io::load_safetensors(ref + "/init.safetensors");
  auto got = core::io::load_safetensors(d.str() + "/export.safetensors");
  auto saved = core::io::load_safetensors(d.str() + "/saved.safetensors");
  ASSERT_EQ(got.size(), init.size());
  for (auto& [name, t] : init) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_EQ(got.at(name).shape(), t.shape()) << name;
    EXPECT_TRUE(test_util::same_bytes(got.at(name), saved.at(name))) << name;
  }
  EXPECT_TRUE(got.count("lm_head.weight"));
  // GPT weights for this Llama model: refused naming the flag, exit 2.
  auto bad = ::weft::test::run_weft("train --config " + ref + "/config.yaml --init-weights " +
                                    std::string(WEFT_REFERENCE_DIR) + "/gpt-tiny/init.safetensors " +
                                    "--set train.steps=1 --set train.out_dir=" + d.str() + "/bad");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--init-weights"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace weft::checkpoint
