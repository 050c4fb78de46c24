// Buffers in checkpoints (StateKind::kBuffer): loss_free's routing bias is training state
// outside the graph. A loss_free run saved at step 3 and resumed continues bit for bit with
// the same bias as the run that never stopped (and a resume that lost the bias would not);
// a loss_free job refuses a checkpoint without the bias, a job without one ignores it, and
// export / import handle it.
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "core/graph/moe_balance.h"
#include "tests/checkpoint/ckpt_util.h"

namespace weft::checkpoint {
namespace {

using test_util::TempDir;
using test_util::train;

// moe-layout (8 MoE blocks, 4 experts, top-2) with balance `balance`. A bias step of 0.05
// moves the top-2 choice within a few steps, so the losses depend on the bias.
core::JobSpec moe_job(const std::string& balance, const std::string& ckpt_dir) {
  core::JobSpec s = core::load_job_spec(
      std::string(WEFT_SOURCE_DIR) + "/configs/moe-layout.yaml",
      {"model.moe.balance=" + balance, "model.moe.bias_update_rate=0.05", "train.threads=1",
       "train.eval_every=0", "train.steps=6", "train.warmup_steps=2"});
  s.checkpoint.dir = ckpt_dir;
  s.checkpoint.every = 0;
  s.checkpoint.keep = 2;
  s.checkpoint.async = false;
  return s;
}

// Every block's bias, concatenated.
std::vector<float> biases(core::Trainer& t) {
  std::vector<float> out;
  core::MoeBalance* b = t.moe_balance();
  if (!b || b->mode() != core::MoeBalance::Mode::kLossFree) return out;
  for (int l : b->layers())
    for (int64_t e = 0; e < b->experts(); ++e) out.push_back(b->bias(l)[e]);
  return out;
}

bool all_zero(const std::vector<float>& v) {
  for (float x : v)
    if (x != 0.0f) return false;
  return true;
}

TEST(CheckpointBuffer, LossFreeResumesBitwiseWithTheRoutingBias) {
  TempDir dir;
  core::JobSpec spec = moe_job("loss_free", dir.str());
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);

  core::Trainer first(spec);
  ASSERT_NE(first.moe_balance(), nullptr);
  TrainerCheckpoints ckpt(spec, first);
  ASSERT_GE(ckpt.space().find(core::MoeBalance::bias_name(0)), 0);
  train(first, data, 3);
  std::vector<float> bias_at_3 = biases(first);
  ASSERT_FALSE(all_zero(bias_at_3)) << "the bias moved in 3 steps";
  const std::string folder = ckpt.save(true);
  std::vector<double> expect = train(first, data, 6);
  std::vector<float> bias_at_6 = biases(first);
  ASSERT_EQ(expect.size(), 3u);
  EXPECT_NE(bias_at_6, bias_at_3);

  // The checkpoint records the biases as buffer states.
  Metadata m = read_metadata(folder, "x");
  for (int l : first.moe_balance()->layers()) {
    int i = m.find_state(core::MoeBalance::bias_name(l));
    ASSERT_GE(i, 0) << "block " << l;
    EXPECT_EQ(m.states[size_t(i)].kind, "buffer");
    EXPECT_EQ(m.states[size_t(i)].shape, core::Shape{spec.model.moe.experts});
  }

  core::Trainer second(spec);
  TrainerCheckpoints resumed(spec, second, dir.str());
  ASSERT_EQ(second.current_step(), 3);
  EXPECT_EQ(biases(second), bias_at_3) << "the bias is loaded";
  std::vector<double> tail = train(second, data, 6);
  ASSERT_EQ(tail.size(), 3u);
  for (size_t i = 0; i < tail.size(); ++i)
    EXPECT_EQ(tail[i], expect[i]) << "step " << 3 + i << " (bitwise: the layout is unchanged)";
  EXPECT_EQ(biases(second), bias_at_6);

  // The control: the same resume with the bias reset to zero trains otherwise, so the
  // comparison above sees a lost bias.
  core::Trainer third(spec);
  TrainerCheckpoints again(spec, third, dir.str());
  for (int l : third.moe_balance()->layers()) third.moe_balance()->bias_tensor(l).fill_(0.0);
  std::vector<double> lost = train(third, data, 6);
  EXPECT_NE(lost, expect) << "a resume without the bias must not match the uninterrupted run";
  EXPECT_NE(biases(third), bias_at_6);
}

TEST(CheckpointBuffer, ALossFreeJobRefusesACheckpointWithoutTheBias) {
  TempDir dir;
  core::JobSpec aux = moe_job("aux_loss", dir.str());
  {
    core::Trainer t(aux);
    EXPECT_EQ(t.moe_balance(), nullptr);
    TrainerCheckpoints(aux, t).save(true);
  }
  core::JobSpec lf = moe_job("loss_free", dir.str());
  core::Trainer u(lf);
  try {
    TrainerCheckpoints(lf, u, dir.str());
    FAIL() << "resumed without the routing bias";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--resume");
    EXPECT_NE(std::string(e.what()).find("lacks state moe.bias:h.0"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(u.current_step(), 0);
}

TEST(CheckpointBuffer, AJobWithoutTheBiasIgnoresIt) {
  TempDir dir;
  core::JobSpec lf = moe_job("loss_free", dir.str());
  core::data::TokenDataset data = core::data::TokenDataset::load(lf);
  std::map<std::string, core::Tensor> saved;
  {
    core::Trainer t(lf);
    TrainerCheckpoints ck(lf, t);
    train(t, data, 2);
    ck.save(true);
    saved = test_util::whole_state(t);
  }
  core::JobSpec aux = moe_job("aux_loss", dir.str());
  core::Trainer u(aux);
  TrainerCheckpoints resumed(aux, u, dir.str());
  EXPECT_EQ(u.current_step(), 2);
  std::map<std::string, core::Tensor> got = test_util::whole_state(u);
  ASSERT_EQ(got.size(), saved.size());
  for (const auto& [name, x] : saved) EXPECT_TRUE(test_util::same_bytes(got.at(name), x)) << name;

  // Export writes the parameters only; import under loss_free writes a zero bias that a
  // loss_free resume accepts.
  const std::string st = (dir.path / "w.safetensors").string();
  const int64_t n = export_safetensors(dir.str(), st);
  EXPECT_EQ(n, int64_t(u.weights().size()));
  TempDir imported;
  const std::string folder = import_safetensors(st, imported.str(), lf);
  Metadata m = read_metadata(folder, "x");
  EXPECT_GE(m.find_state(core::MoeBalance::bias_name(0)), 0);
  core::Trainer v(lf);
  TrainerCheckpoints from_import(lf, v, imported.str());
  EXPECT_EQ(v.current_step(), 0);
  EXPECT_TRUE(all_zero(biases(v)));
}

}  // namespace
}  // namespace weft::checkpoint
