// Point-wise GELU (tanh approximation, as GPT-2 and the PyTorch reference use) and the
// row softmax with its backward. Softmax subtracts the row maximum and sums in double.
#include <cmath>
#include <limits>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"
#include "core/cpu/vmath.h"

namespace weft::core::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;
// GELU evaluates e = e^(-2u) and s = 1 / (1 + e). Capping the exponent at 80 keeps s
// (>= 1.8e-35) and e * s finite and normal: subnormal floats cost ~100x per operation,
// e = inf would turn e * s into NaN, and the true values there are below 1e-30 anyway.
template <typename T>
T gelu_exp(T z) {
  return detail::vexp(z < T(80) ? z : T(80));
}

}  // namespace

// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Computed in the equal
// form x * sigmoid(2u) = x / (1 + e^(-2u)): one exp that vectorises, and no cancellation
// in 1 + tanh(u) for negative u.
template <typename T>
void gelu_forward(const T* x, T* y, int64_t n) {
  const T k2 = T(2 * kSqrt2OverPi), a = T(kGeluCubic);
#pragma omp parallel for simd schedule(static) if (parallel : detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = v / (T(1) + gelu_exp(-k2 * (v + a * v * v * v)));
  }
}

// With s = sigmoid(2u): 1 + tanh(u) = 2s and 1 - tanh(u)^2 = 4 s (1 - s), so
// gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2), and 1 - s = e s with
// e = e^(-2u) keeps full precision when s is close to 1.
template <typename T>
void gelu_backward(const T* dy, const T* x, T* dx, bool accumulate_dx, int64_t n) {
  const T k = T(kSqrt2OverPi), a = T(kGeluCubic);
#pragma omp parallel for simd schedule(static) if (parallel : detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T e = gelu_exp(T(-2) * k * (v + a * v * v * v));
    const T s = T(1) / (T(1) + e);
    const T d = s + T(2) * v * s * (e * s) * k * (T(1) + T(3) * a * v * v);
    const T g = dy[i] * d;
    dx[i] = accumulate_dx ? dx[i] + g : g;
  }
}

template <typename T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols) {
  WEFT_CHECK(rows >= 0 && cols > 0, "softmax_forward: bad sizes rows=", rows, " cols=", cols);
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(rows * cols))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t c = 0; c < cols; ++c) mx = xr[c] > mx ? xr[c] : mx;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) yr[c] = detail::vexp(xr[c] - mx);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; ++c) s += double(yr[c]);
    const T inv = T(1.0 / s);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
}

// dx = y * (dy - sum(dy * y)) per row
template <typename T>
void softmax_backward(const T* dy, const T* y, T* dx, bool accumulate_dx, int64_t rows,
                      int64_t cols) {
  WEFT_CHECK(rows >= 0 && cols > 0, "softmax_backward: bad sizes rows=", rows, " cols=", cols);
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(rows * cols))
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * cols;
    const T* yr = y + r * cols;
    T* dxr = dx + r * cols;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; ++c) s += double(dyr[c]) * double(yr[c]);
    const T dot = T(s);
    if (accumulate_dx) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) dxr[c] += yr[c] * (dyr[c] - dot);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) dxr[c] = yr[c] * (dyr[c] - dot);
    }
  }
}

template void gelu_forward<float>(const float*, float*, int64_t);
template void gelu_forward<double>(const double*, double*, int64_t);
template void gelu_backward<float>(const float*, const float*, float*, bool, int64_t);
template void gelu_backward<double>(const double*, const double*, double*, bool, int64_t);
template void softmax_forward<float>(const float*, float*, int64_t, int64_t);
template void softmax_forward<double>(const double*, double*, int64_t, int64_t);
template void softmax_backward<float>(const float*, const float*, float*, bool, int64_t, int64_t);
template void softmax_backward<double>(const double*, const double*, double*, bool, int64_t,
                                       int64_t);

}  // namespace weft::core::cpu
