// Sequence parallelism with real processes: tp2 and tp2 x pp2 with
// parallel.sequence_parallel give the single-process numbers at the tp layouts' tolerance
// (the norms' weight gradients are sums over the sequence halves, one more regrouping), for
// GPT (LayerNorm, GELU), the Llama block (RMSNorm, SwiGLU) and MoE-GPT under tp x ep. The pp2
// cases send activations and their gradients between stages split on the sequence.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "parallel/trainer.h"
#include "tests/parallel/layout_harness.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

void check(LayoutCase c) { expect_invariant(c, run_layout(c)); }

TEST(SequenceParallelLayout, GptTp2) {
  check({"gpt-layout.yaml",
         2,
         {"parallel.dp=1", "parallel.tp=2", "parallel.sequence_parallel=true"},
         6,
         kSplit});
}
TEST(SequenceParallelLayout, GptTp2Pp2) {
  check({"gpt-layout.yaml",
         4,
         {"parallel.dp=1", "parallel.tp=2", "parallel.pp=2", "parallel.pipeline.schedule=1f1b",
          "parallel.sequence_parallel=true"},
         6,
         kSplit});
}
TEST(SequenceParallelLayout, LlamaTp2) {
  check({"llama-layout.yaml",
         2,
         {"parallel.dp=1", "parallel.tp=2", "parallel.sequence_parallel=true"},
         6,
         kSplit});
}
TEST(SequenceParallelLayout, LlamaTp2Pp2) {
  check({"llama-layout.yaml",
         4,
         {"parallel.dp=1", "parallel.tp=2", "parallel.pp=2", "parallel.pipeline.schedule=1f1b",
          "parallel.sequence_parallel=true"},
         6,
         kSplit});
}

// MoE layers under tp split the experts' hidden units and read their input whole: it is
// gathered from the split norm like a column-parallel matmul's, with experts also over ep.
TEST(SequenceParallelLayout, MoeTp2Ep2) {
  check({"moe-layout.yaml",
         4,
         {"parallel.dp=1", "parallel.tp=2", "parallel.ep=2", "parallel.sequence_parallel=true"},
         6,
         kSplit});
}

// The executor's measured peak of live activation bytes (the transient arena) per rank,
// after `steps` steps of the layout `sets` on `world` ranks; empty when a rank failed.
std::vector<int64_t> measured_peaks(const std::string& config, int world,
                                    const std::vector<std::string>& sets) {
  LayoutCase c{config, world, sets, 2, kSplit};
  core::JobSpec spec = layout_spec(c);
  core::cpu::set_num_threads(1);
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("weft_sp_peak_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  RunOptions ro;
  ro.deadline = std::chrono::milliseconds(300'000);
  RunResult r = run_ranks(
      world,
      [&](RankContext& ctx) {
        RankWorld w = gloo_world(ctx, "sp_peak");
        parallel::ParallelTrainer pt(spec, *w.comm);
        for (int s = 0; s < c.steps; ++s) pt.step(batch);
        std::ofstream(dir / std::to_string(ctx.rank())) << pt.activation_stats().bytes_live_peak;
      },
      ro);
  std::vector<int64_t> peaks;
  if (r.ok())
    for (int k = 0; k < world; ++k) {
      int64_t v = -1;
      std::ifstream(dir / std::to_string(k)) >> v;
      peaks.push_back(v);
    }
  else
    ADD_FAILURE() << r.summary();
  fs::remove_all(dir);
  return peaks;
}

// What the plan promises, measured: every rank's peak of live activation bytes under tp2
// with sequence parallelism is below plain tp2's (the same plan-driven allocations, minus
// the residual stream's and the norms' replicas).
TEST(SequenceParallelLayout, MeasuredPeakBelowPlainTp) {
  for (const char* config : {"gpt-layout.yaml", "llama-layout.yaml"}) {
    SCOPED_TRACE(config);
    const std::vector<std::string> tp = {"parallel.dp=1", "parallel.tp=2"};
    std::vector<std::string> sp = tp;
    sp.push_back("parallel.sequence_parallel=true");
    std::vector<int64_t> a = measured_peaks(config, 2, tp), b = measured_peaks(config, 2, sp);
    ASSERT_EQ(a.size(), 2u);
    ASSERT_EQ(b.size(), 2u);
    for (int k = 0; k < 2; ++k) {
      std::printf("[sp] %s rank %d measured activation peak: tp2 %lld B, tp2+sp %lld B\n", config,
                  k, (long long)a[size_t(k)], (long long)b[size_t(k)]);
      EXPECT_GT(b[size_t(k)], 0);
      EXPECT_LT(b[size_t(k)], a[size_t(k)]);
    }
  }
}

}  // namespace
}  // namespace weft::test
