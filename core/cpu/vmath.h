// Internal: an exp that GCC vectorises inside `omp simd` loops without -ffast-math
// (libm calls stay scalar). Float uses a Cephes-style range reduction and polynomial
// (about 2 ulp); double keeps std::exp, since double is the gradient-check path.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace weft::core::cpu::detail {

// e^x for float, within about 2 ulp. Below -87.34 (where e^x would be subnormal) it
// returns 0, above 88 it saturates at e^88; NaN stays NaN.
inline float exp_f32(float x) {
  const float xc = x > 88.0f ? 88.0f : (x < -87.3365447504f ? -87.3365447504f : x);
  // n = round(x / ln 2): adding 1.5 * 2^23 leaves the rounded integer in the low bits.
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  // r = x - n ln 2 in two parts (Cody-Waite), |r| <= ln(2) / 2.
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float y = er * std::bit_cast<float>((ni + 127) << 23);  // 2^n, n in [-126, 127]
  return x < -87.3365447504f ? 0.0f : y;
}

inline float vexp(float x) { return exp_f32(x); }
inline double vexp(double x) { return std::exp(x); }

}  // namespace weft::core::cpu::detail
