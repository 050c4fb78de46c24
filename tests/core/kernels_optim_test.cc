// AdamW against a hand-computed two-step example, with and without weight decay, in
// float and double.
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "core/cpu/kernels.h"

namespace weft::core::cpu {
namespace {

// Hyperparameters exactly representable in float, so the float and double kernels see
// the same values as the hand computation.
AdamWParams params(int64_t step, float grad_scale) {
  return AdamWParams{/*lr=*/0.125f,
                     /*beta1=*/0.75f,
                     /*beta2=*/0.875f,
                     /*eps=*/1.0f / 1024,
                     /*weight_decay=*/0.5f, step, grad_scale};
}

// Step 1 by hand, p = 1, g = 0.5, decay on:
//   p = 1 * (1 - 0.125 * 0.5) = 0.9375;  m = 0.25 * 0.5 = 0.125;  v = 0.125 * 0.25 = 0.03125
//   m^ = 0.125 / 0.25 = 0.5;  v^ = 0.03125 / 0.125 = 0.25;  sqrt(v^) + eps = 0.5009765625
//   p = 0.9375 - 0.125 * 0.5 / 0.5009765625 = 0.81274366471734893
// Step 2 uses g = 0.2 and 0.6 with grad_scale 0.5 (as after clipping).
template <typename T>
void check_adamw(bool decay, const std::vector<double>& want1, const std::vector<double>& want2,
                 double tol) {
  std::vector<T> p = {T(1.0), T(-2.0)}, m(2, T(0)), v(2, T(0));
  const std::vector<T> g1 = {T(0.5), T(-1.0)}, g2 = {T(0.2), T(0.6)};
  adamw_update(p.data(), g1.data(), m.data(), v.data(), 2, params(1, 1.0f), decay);
  EXPECT_NEAR(p[0], want1[0], tol);
  EXPECT_NEAR(p[1], want1[1], tol);
  EXPECT_NEAR(m[0], 0.125, tol);
  EXPECT_NEAR(v[1], 0.125, tol);
  adamw_update(p.data(), g2.data(), m.data(), v.data(), 2, params(2, 0.5f), decay);
  EXPECT_NEAR(p[0], want2[0], tol);
  EXPECT_NEAR(p[1], want2[1], tol);
  EXPECT_NEAR(m[0], 0.75 * 0.125 + 0.25 * 0.1, tol);  // the scaled gradient enters m
  EXPECT_NEAR(m[1], 0.75 * -0.25 + 0.25 * 0.3, tol);
  EXPECT_NEAR(v[0], 0.875 * 0.03125 + 0.125 * 0.01, tol);
  EXPECT_NEAR(v[1], 0.875 * 0.125 + 0.125 * 0.09, tol);
}

TEST(KernelsOptim, AdamWTwoStepsWithDecay) {
  const std::vector<double> s1 = {0.81274366471734893, -1.7501219512195121};
  const std::vector<double> s2 = {0.66508079604384129, -1.5959957546677577};
  check_adamw<double>(true, s1, s2, 1e-12);
  check_adamw<float>(true, s1, s2, 2e-6);
}

TEST(KernelsOptim, AdamWTwoStepsWithoutDecay) {
  const std::vector<double> s1 = {0.87524366471734893, -1.8751219512195121};
  const std::vector<double> s2 = {0.7783772750886756, -1.8303783766189772};
  check_adamw<double>(false, s1, s2, 1e-12);
  check_adamw<float>(false, s1, s2, 2e-6);
}

TEST(KernelsOptim, AdamWRejectsStepZero) {
  std::vector<float> p(1), g(1), m(1), v(1);
  EXPECT_THROW(adamw_update(p.data(), g.data(), m.data(), v.data(), 1, params(0, 1.0f), true),
               InternalError);
}

}  // namespace
}  // namespace weft::core::cpu
