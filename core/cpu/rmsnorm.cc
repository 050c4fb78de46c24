// RMSNorm over the last dimension C (Llama's norm: no mean subtraction, no bias, eps
// inside the sqrt). Sums of squares are accumulated in double; the weight gradient is a
// column reduction that gives the same bits for every thread count, as in LayerNorm.
#include <cmath>
#include <vector>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"

namespace weft::core::cpu {

// x, y (N,C); w (C); rstd (N).
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t C, T eps) {
  WEFT_CHECK(N >= 0 && C > 0, "rmsnorm_forward: bad sizes N=", N, " C=", C);
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * double(xr[c]);
    const T r = T(1.0 / std::sqrt(ss / double(C) + double(eps)));
    T* yr = y + n * C;
    // (x * rstd) * w, in the order of the reference and of transformers' LlamaRMSNorm.
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
    rstd[n] = r;
  }
}

// With xhat = x * rstd and g = dy * w: dx = rstd * (g - xhat * mean(g * xhat)), since
// d rstd / dx = -rstd^3 x / C. dw += sum_n dy * xhat.
template <typename T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd,
                      std::type_identity_t<T>* dx, bool accumulate_dx, std::type_identity_t<T>* dw,
                      int64_t N, int64_t C) {
  WEFT_CHECK(N >= 0 && C > 0, "rmsnorm_backward: bad sizes N=", N, " C=", C);
  if (dx) {
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * C))
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;
      const T* dyr = dy + n * C;
      const T r = rstd[n];
      double sgx = 0;
#pragma omp simd reduction(+ : sgx)
      for (int64_t c = 0; c < C; ++c) sgx += double(dyr[c] * w[c]) * double(xr[c] * r);
      const T mgx = T(sgx / double(C));
      T* dxr = dx + n * C;
      if (accumulate_dx) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] += r * (dyr[c] * w[c] - xr[c] * r * mgx);
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] = r * (dyr[c] * w[c] - xr[c] * r * mgx);
      }
    }
  }
  if (!dw) return;
  detail::parallel_columns(C, N * C, [&](int64_t c0, int64_t c1) {
    const int64_t len = c1 - c0;
    std::vector<double> acc(size_t(len), 0.0);
    double* pw = acc.data();
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C + c0;
      const T* dyr = dy + n * C + c0;
      const T r = rstd[n];
#pragma omp simd
      for (int64_t c = 0; c < len; ++c) pw[c] += double(dyr[c]) * double(xr[c] * r);
    }
    for (int64_t c = 0; c < len; ++c) dw[c0 + c] += T(pw[c]);
  });
}

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t,
                                     float);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t,
                                      int64_t, double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*,
                                      float*, bool, float*, int64_t, int64_t);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*,
                                       double*, bool, double*, int64_t, int64_t);

}  // namespace weft::core::cpu
