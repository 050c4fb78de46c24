// Linear layer y = x @ w^T + b on top of the BLAS GEMM; the bias gradient is a column
// reduction that gives the same bits for every thread count.
#include <vector>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"

namespace weft::core::cpu {

// x (N,in), w (out,in), b (out) or null, y (N,out).
template <typename T>
void linear_forward(const T* x, const T* w, const std::type_identity_t<T>* b, T* y, int64_t N,
                    int64_t in, int64_t out) {
  WEFT_CHECK(N >= 0 && in >= 0 && out >= 0, "linear_forward: bad sizes N=", N, " in=", in,
             " out=", out);
  if (N == 0 || out == 0) return;
  if (b) {
    // Seed y with the bias so the GEMM adds into it (beta = 1): no second pass over y.
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * out))
    for (int64_t n = 0; n < N; ++n) {
      T* yr = y + n * out;
#pragma omp simd
      for (int64_t o = 0; o < out; ++o) yr[o] = b[o];
    }
  }
  gemm<T>(false, true, N, out, in, T(1), x, in, w, in, b ? T(1) : T(0), y, out);
}

template <typename T>
void linear_backward(const T* dy, const T* x, const T* w, std::type_identity_t<T>* dx,
                     bool accumulate_dx, std::type_identity_t<T>* dw, std::type_identity_t<T>* db,
                     int64_t N, int64_t in, int64_t out) {
  WEFT_CHECK(N >= 0 && in >= 0 && out >= 0, "linear_backward: bad sizes N=", N, " in=", in,
             " out=", out);
  // dx (N,in) = dy (N,out) @ w (out,in)
  if (dx)
    gemm<T>(false, false, N, in, out, T(1), dy, out, w, in, accumulate_dx ? T(1) : T(0), dx, in);
  // dw (out,in) += dy^T (out,N) @ x (N,in)
  if (dw) gemm<T>(true, false, out, in, N, T(1), dy, out, x, in, T(1), dw, in);
  // db (out) += sum over rows of dy, summed in double in row order per column.
  if (db && out > 0) {
    detail::parallel_columns(out, N * out, [&](int64_t c0, int64_t c1) {
      std::vector<double> acc(size_t(c1 - c0), 0.0);
      double* a = acc.data();
      for (int64_t n = 0; n < N; ++n) {
        const T* r = dy + n * out + c0;
#pragma omp simd
        for (int64_t c = 0; c < c1 - c0; ++c) a[c] += double(r[c]);
      }
      for (int64_t c = c0; c < c1; ++c) db[c] += T(a[c - c0]);
    });
  }
}

template void linear_forward<float>(const float*, const float*, const float*, float*, int64_t,
                                    int64_t, int64_t);
template void linear_forward<double>(const double*, const double*, const double*, double*, int64_t,
                                     int64_t, int64_t);
template void linear_backward<float>(const float*, const float*, const float*, float*, bool, float*,
                                     float*, int64_t, int64_t, int64_t);
template void linear_backward<double>(const double*, const double*, const double*, double*, bool,
                                      double*, double*, int64_t, int64_t, int64_t);

}  // namespace weft::core::cpu
