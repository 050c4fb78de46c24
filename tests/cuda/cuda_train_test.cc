// Whole training steps on the GPU against the CPU trainer (f32): same spec, seed and
// batches, so the losses must agree within bf16 rounding, and both must learn. Skipped
// when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cuda/trainer.h"
#include "core/exec/trainer.h"
#include "cuda_test_util.h"

namespace weft::core::cuda {
namespace {

// ||got - want|| / ||want||: robust to the few elements bf16 perturbs most.
double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

JobSpec tiny_spec() {
  JobSpec s;
  s.model.arch = "gpt";
  s.model.layers = 2, s.model.dim = 64, s.model.heads = 4, s.model.vocab = 96;
  s.model.seq_len = 32;
  s.train.global_batch = 8, s.train.micro_batch = 4;  // two micro-batches: accumulation
  s.train.lr = 3e-3, s.train.min_lr = 3e-4, s.train.warmup_steps = 2, s.train.steps = 8;
  s.train.seed = 1234;
  s.device = "cuda";
  return s;
}

// A learnable stream: token t+1 = (3 * token t + 1) mod V, starting points from the index.
BatchFn patterned(int64_t T, int64_t V) {
  return [T, V](int64_t step, int64_t first, int64_t count, int32_t* x, int32_t* y) {
    for (int64_t b = 0; b < count; ++b) {
      int64_t tok = (step * 131 + (first + b) * 17) % V;
      for (int64_t t = 0; t < T; ++t) {
        x[b * T + t] = int32_t(tok);
        tok = (3 * tok + 1) % V;
        y[b * T + t] = int32_t(tok);
      }
    }
  };
}

TEST(CudaTrainer, InitialWeightsMatchTheCpuTrainer) {
  WEFT_REQUIRE_GPU();
  JobSpec s = tiny_spec();
  JobSpec cs = s;
  cs.device = "cpu";
  Trainer cpu(cs);
  CudaTrainer gpu(s);
  NamedTensors a = cpu.weights(), b = gpu.weights();
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(t.to_vector<float>(), b.at(name).to_vector<float>()) << name;  // f32 masters
  }
}

TEST(CudaTrainer, StepsTrackTheCpuTrainer) {
  WEFT_REQUIRE_GPU();
  JobSpec s = tiny_spec();
  JobSpec cs = s;
  cs.device = "cpu";
  Trainer cpu(cs);
  CudaTrainer gpu(s);
  NamedTensors init = cpu.weights();
  BatchFn batch = patterned(s.model.seq_len, s.model.vocab);
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    StepStats c = cpu.step(batch), g = gpu.step(batch);
    EXPECT_EQ(g.step, c.step);
    EXPECT_DOUBLE_EQ(g.lr, c.lr);
    EXPECT_EQ(g.tokens, c.tokens);
    // bf16 compute: ~3 significant digits per op; the curves stay within a few percent.
    EXPECT_NEAR(g.loss, c.loss, 0.02 * c.loss + 0.02) << "step " << i;
    EXPECT_NEAR(g.grad_norm, c.grad_norm, 0.1 * c.grad_norm + 0.02) << "step " << i;
    if (i == 0) first = g.loss;
    last = g.loss;
  }
  EXPECT_LT(last, first - 0.3) << "the GPU trainer does not learn";
  // After the same 8 updates the weights moved the same way. Compared as whole updates:
  // AdamW turns a tiny gradient into a full step of either sign, so single elements whose
  // gradient bf16 flips may differ by 2 lr per step; a wrong kernel gives an error ~1.
  NamedTensors a = cpu.weights(), b = gpu.weights();
  for (auto& [name, t] : a) {
    std::vector<float> w0 = init.at(name).to_vector<float>();
    EXPECT_LT(rel_l2(minus(b.at(name).to_vector<float>(), w0), minus(t.to_vector<float>(), w0)),
              0.5)
        << name;
  }
}

// Both attention implementations (cuBLASLt and the flash kernel) give the CPU's gradients.
class CudaTrainerGrads : public ::testing::TestWithParam<AttentionImpl> {};
INSTANTIATE_TEST_SUITE_P(Attention, CudaTrainerGrads,
                         ::testing::Values(AttentionImpl::kGemm, AttentionImpl::kFlash),
                         [](const auto& info) {
                           return info.param == AttentionImpl::kGemm ? "Gemm" : "Flash";
                         });
TEST_P(CudaTrainerGrads, OneStepMatchesTheCpu) {
  WEFT_REQUIRE_GPU();
  JobSpec s = tiny_spec();
  JobSpec cs = s;
  cs.device = "cpu";
  Trainer cpu(cs);
  ExecutorOptions o;
  o.attention = GetParam();
  CudaTrainer gpu(s, o);
  BatchFn batch = patterned(s.model.seq_len, s.model.vocab);
  cpu.step(batch);
  gpu.step(batch);
  NamedTensors a = cpu.gradients(), b = gpu.gradients();
  for (auto& [name, t] : a)  // bf16 activations perturb every gradient by ~1%
    EXPECT_LT(rel_l2(b.at(name).to_vector<float>(), t.to_vector<float>()), 0.08) << name;
}

// The Llama block on the GPU (RMSNorm, rotary, grouped-query attention on cuBLASLt, SwiGLU,
// no position table): the first step's gradients as the CPU's within bf16 rounding, and
// eight steps that track the CPU's losses and learn. Tolerances are GPT's above.
TEST(CudaTrainer, LlamaTracksTheCpuTrainer) {
  WEFT_REQUIRE_GPU();
  JobSpec s = tiny_spec();
  s.model.arch = "llama";
  s.model.kv_heads = 2;  // 4 query heads share 2 KV heads
  JobSpec cs = s;
  cs.device = "cpu";
  Trainer cpu(cs);
  CudaTrainer gpu(s);
  BatchFn batch = patterned(s.model.seq_len, s.model.vocab);
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    StepStats c = cpu.step(batch), g = gpu.step(batch);
    if (i == 0) {
      NamedTensors a = cpu.gradients(), b = gpu.gradients();
      ASSERT_EQ(a.size(), b.size());
      for (auto& [name, t] : a)
        EXPECT_LT(rel_l2(b.at(name).to_vector<float>(), t.to_vector<float>()), 0.08) << name;
    }
    EXPECT_NEAR(g.loss, c.loss, 0.02 * c.loss + 0.02) << "step " << i;
    EXPECT_NEAR(g.grad_norm, c.grad_norm, 0.1 * c.grad_norm + 0.02) << "step " << i;
    if (i == 0) first = g.loss;
    last = g.loss;
  }
  EXPECT_LT(last, first - 0.3) << "the GPU trainer does not learn";
}

TEST(CudaTrainer, PlannedArenaGivesTheSameLosses) {
  WEFT_REQUIRE_GPU();
  JobSpec s = tiny_spec();
  JobSpec p = s;
  p.memory.allocator = "planned";
  CudaTrainer a(s), b(p);
  BatchFn batch = patterned(s.model.seq_len, s.model.vocab);
  for (int i = 0; i < 4; ++i) {
    StepStats x = a.step(batch), y = b.step(batch);
    // Same kernels in the same order; only the addresses differ (embedding atomics aside).
    EXPECT_NEAR(x.loss, y.loss, 1e-3 * x.loss) << "step " << i;
  }
}

TEST(CudaTrainer, MoeRunsThroughTheHostFallback) {
  WEFT_REQUIRE_GPU();
  JobSpec s = tiny_spec();
  s.model.arch = "moe-gpt";
  s.model.moe.experts = 4;
  s.model.moe.top_k = 2;
  JobSpec cs = s;
  cs.device = "cpu";
  Trainer cpu(cs);
  CudaTrainer gpu(s);
  BatchFn batch = patterned(s.model.seq_len, s.model.vocab);
  for (int i = 0; i < 3; ++i) {
    StepStats c = cpu.step(batch), g = gpu.step(batch);
    EXPECT_NEAR(g.loss, c.loss, 0.03 * c.loss + 0.02) << "step " << i;
    EXPECT_NEAR(g.aux_loss, c.aux_loss, 0.1 * c.aux_loss + 0.02) << "step " << i;
  }
}

TEST(CudaTrainer, BadTokenIdsAreRefusedOnTheHost) {
  WEFT_REQUIRE_GPU();
  JobSpec s = tiny_spec();
  CudaTrainer gpu(s);
  BatchFn bad = [](int64_t, int64_t, int64_t count, int32_t* x, int32_t* y) {
    for (int64_t i = 0; i < count * 32; ++i) x[i] = y[i] = 1;
    x[5] = 96;  // == V
  };
  EXPECT_THROW(gpu.step(bad), InternalError);
}

}  // namespace
}  // namespace weft::core::cuda
