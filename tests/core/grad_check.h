// Helpers of the kernels' finite-difference checks in double (kernels_grad_test.cc,
// llama_kernels_test.cc): random vectors, dot and sum, and central differences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace weft::core::cpu::gradcheck {

using Vec = std::vector<double>;
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(gen);
  return v;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline Vec plus(const Vec& a, const Vec& b) {
  Vec c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

// d loss / d x[i] by central differences; x is restored afterwards.
inline Vec numeric_grad(const std::function<double()>& loss, Vec& x, double h = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

}  // namespace weft::core::cpu::gradcheck
