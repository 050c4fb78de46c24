// The executor's per-op-type profile that weft calibrate's op rates read
// (GraphExecutor::set_profiling): the thread's CPU time is kept beside the wall time only
// when asked (its clock is a system call per op), for the same types.
#include <gtest/gtest.h>

#include <cmath>

#include "core/exec/trainer.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

core::BatchFn tokens(const core::JobSpec& spec) {
  return [seq = spec.model.seq_len](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    for (int64_t i = 0; i < n * seq; ++i) {
      x[i] = int32_t((s * 131 + b0 * 17 + i * 7) % 256);
      y[i] = int32_t((s * 131 + b0 * 17 + i * 7 + 1) % 256);
    }
  };
}

TEST(OpRates, TheCpuProfileCoversTheWallProfilesTypesOnlyWhenAsked) {
  core::JobSpec spec = test_util::gpt_spec(2);
  spec.train.threads = 1;
  for (const bool cpu : {false, true}) {
    core::Trainer t(spec);
    t.executor().set_profiling(true, cpu);
    t.step(tokens(spec));
    const auto& wall = t.executor().profile();
    const auto& cpu_s = t.executor().profile_cpu();
    ASSERT_GT(wall.size(), 5u);
    if (!cpu) {
      EXPECT_TRUE(cpu_s.empty());
      continue;
    }
    ASSERT_EQ(cpu_s.size(), wall.size());
    double total = 0;
    for (const auto& [type, secs] : wall) {
      ASSERT_TRUE(cpu_s.count(type)) << type;
      EXPECT_TRUE(std::isfinite(cpu_s.at(type))) << type;
      total += cpu_s.at(type);
    }
    // Less the clock's own cost per op, the step's kernels still took time.
    EXPECT_GT(total, 0);
  }
}

}  // namespace
}  // namespace weft::planner
