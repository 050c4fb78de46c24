// GEMM through OpenBLAS (cblas, row-major). The batched form runs one single-threaded
// cblas call per matrix inside an OpenMP loop when there are enough matrices to keep
// every thread busy, and falls back to threaded cblas calls one after another otherwise.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>

#include "base/check.h"
#include "core/cpu/kernels.h"

namespace weft::core::cpu {
namespace {

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, float alpha,
               const float* A, blasint lda, const float* B, blasint ldb, float beta, float* C,
               blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K,
               double alpha, const double* A, blasint lda, const double* B, blasint ldb,
               double beta, double* C, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Validates shapes and leading dimensions once, with a message, instead of letting
// cblas print to stderr (OpenBLAS's xerbla does not throw).
void check_gemm_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                     int64_t ldb, int64_t ldc) {
  WEFT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  WEFT_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                 ldc <= INT_MAX,
             "gemm: sizes exceed the BLAS integer range");
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  WEFT_CHECK(lda >= std::max<int64_t>(1, a_cols), "gemm: lda=", lda, " < ", a_cols);
  WEFT_CHECK(ldb >= std::max<int64_t>(1, b_cols), "gemm: ldb=", ldb, " < ", b_cols);
  WEFT_CHECK(ldc >= std::max<int64_t>(1, N), "gemm: ldc=", ldc, " < ", N);
}

// C = beta * C for an empty inner dimension (K == 0); beta == 0 writes zeros without
// reading C, as BLAS does.
template <typename T>
void scale_c(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
}

template <typename T>
void gemm_unchecked(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
                    const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blasint(M),
            blasint(N), blasint(K), alpha, A, blasint(lda), B, blasint(ldb), beta, C, blasint(ldc));
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  gemm_unchecked(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta,
                  T* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  WEFT_CHECK(batch >= 0, "gemm_batched: negative batch ", batch);
  if (batch < omp_get_max_threads()) {
    // Too few matrices to occupy every thread: let OpenBLAS thread each one.
    for (int64_t i = 0; i < batch; ++i)
      gemm_unchecked(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb,
                     beta, C + i * stride_c, ldc);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < batch; ++i)
    gemm_unchecked(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb,
                   beta, C + i * stride_c, ldc);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);
template void gemm_batched<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                  int64_t, int64_t, const float*, int64_t, int64_t, float, float*,
                                  int64_t, int64_t, int64_t);
template void gemm_batched<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                   int64_t, int64_t, const double*, int64_t, int64_t, double,
                                   double*, int64_t, int64_t, int64_t);

}  // namespace weft::core::cpu
