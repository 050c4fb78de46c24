// The CUDA AdamW's non-finite guard (as the CPU's run_adamw): a NaN global norm leaves every
// parameter, moment and bf16 compute copy as it was. Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/cuda/kernels.h"
#include "cuda_test_util.h"

namespace weft::core::cuda {
namespace {

using testing::Gpu;
using testing::random_bf16;

TEST(CudaNonfinite, AdamWLeavesStateWhenTheNormIsNaN) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t n = 5000;
  std::vector<float> p = random_bf16(n, 1), g = random_bf16(n, 2, 0.1f),
                     m = random_bf16(n, 3, 0.01f), v = random_bf16(n, 4, 0.01f);
  for (float& x : v) x = std::fabs(x);
  g[17] = std::numeric_limits<float>::quiet_NaN();
  Tensor dp = gpu.put({n}, p, DType::kF32), dg = gpu.put({n}, g, DType::kF32),
         dm = gpu.put({n}, m, DType::kF32), dv = gpu.put({n}, v, DType::kF32),
         dpb = gpu.zeros({n}, DType::kBF16);
  std::vector<int64_t> sizes{n};
  Tensor norm = gpu.zeros({1}, DType::kF64);
  Tensor ws = gpu.zeros({int64_t(sum_squares_workspace(sizes))}, DType::kF64);
  global_norm({dg.data<float>()}, sizes, norm.data<double>(), ws.data<double>(), gpu.stream());
  EXPECT_TRUE(std::isnan(to_host(norm, gpu.stream()).item()));
  AdamWHyper hp{3e-3, 0.9, 0.95, 1e-8, 0.1, /*grad_clip=*/1.0, /*step=*/3};
  adamw_multi({{dp.data<float>(), dg.data<float>(), dm.data<float>(), dv.data<float>(),
                dpb.data<bf16>(), n, true}},
              hp, norm.data<double>(), gpu.stream());
  EXPECT_EQ(gpu.get(dp), p);
  EXPECT_EQ(gpu.get(dm), m);
  EXPECT_EQ(gpu.get(dv), v);
  EXPECT_EQ(gpu.get(dpb), std::vector<float>(size_t(n), 0.0f));  // no compute copy written
}

}  // namespace
}  // namespace weft::core::cuda
