// LayerNorm over the last dimension C (eps inside the sqrt). Row statistics are
// accumulated in double; the weight and bias gradients are column reductions that give
// the same bits for every thread count.
#include <cmath>
#include <vector>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"

namespace weft::core::cpu {

// x, y (N,C); w, b (C); mean, rstd (N).
template <typename T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t N,
                       int64_t C, T eps) {
  WEFT_CHECK(N >= 0 && C > 0, "layernorm_forward: bad sizes N=", N, " C=", C);
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += double(xr[c]);
    const double mu = s / double(C);
    // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - mu^2.
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) {
      const double d = double(xr[c]) - mu;
      ss += d * d;
    }
    const double rs = 1.0 / std::sqrt(ss / double(C) + double(eps));
    const T m = T(mu), r = T(rs);
    T* yr = y + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, xhat = (x - mean) * rstd.
// dw += sum_n dy * xhat, db += sum_n dy (each skipped when null).
template <typename T>
void layernorm_backward(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                        std::type_identity_t<T>* dx, bool accumulate_dx,
                        std::type_identity_t<T>* dw, std::type_identity_t<T>* db, int64_t N,
                        int64_t C) {
  WEFT_CHECK(N >= 0 && C > 0, "layernorm_backward: bad sizes N=", N, " C=", C);
  if (dx) {
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * C))
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;
      const T* dyr = dy + n * C;
      const T m = mean[n], r = rstd[n];
      double sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t c = 0; c < C; ++c) {
        const T g = dyr[c] * w[c];
        sg += double(g);
        sgx += double(g) * double((xr[c] - m) * r);
      }
      const T mg = T(sg / double(C)), mgx = T(sgx / double(C));
      T* dxr = dx + n * C;
      if (accumulate_dx) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] += r * (dyr[c] * w[c] - mg - (xr[c] - m) * r * mgx);
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] = r * (dyr[c] * w[c] - mg - (xr[c] - m) * r * mgx);
      }
    }
  }
  if (!dw && !db) return;
  detail::parallel_columns(C, N * C, [&](int64_t c0, int64_t c1) {
    const int64_t len = c1 - c0;
    std::vector<double> aw(size_t(len), 0.0), ab(size_t(len), 0.0);
    double* pw = aw.data();
    double* pb = ab.data();
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C + c0;
      const T* dyr = dy + n * C + c0;
      const T m = mean[n], r = rstd[n];
#pragma omp simd
      for (int64_t c = 0; c < len; ++c) {
        pw[c] += double(dyr[c]) * double((xr[c] - m) * r);
        pb[c] += double(dyr[c]);
      }
    }
    if (dw)
      for (int64_t c = 0; c < len; ++c) dw[c0 + c] += T(pw[c]);
    if (db)
      for (int64_t c = 0; c < len; ++c) db[c0 + c] += T(pb[c]);
  });
}

template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*,
                                       float*, int64_t, int64_t, float);
template void layernorm_forward<double>(const double*, const double*, const double*, double*,
                                        double*, double*, int64_t, int64_t, double);
template void layernorm_backward<float>(const float*, const float*, const float*, const float*,
                                        const float*, float*, bool, float*, float*, int64_t,
                                        int64_t);
template void layernorm_backward<double>(const double*, const double*, const double*, const double*,
                                         const double*, double*, bool, double*, double*, int64_t,
                                         int64_t);

}  // namespace weft::core::cpu
