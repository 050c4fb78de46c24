// Causal self-attention for one (batch, head) pair at a time, parallel over pairs.
// The sequence is cut into blocks of kBlock rows; row block [r0, r1) only needs keys
// [0, r1), so the GEMMs skip the blocks above the diagonal (3/8 fewer flops at
// T = 256 than full T x T products).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"
#include "core/cpu/vmath.h"

namespace weft::core::cpu {
namespace {

constexpr int64_t kBlock = 64;

void check_attention_args(int64_t B, int64_t Tn, int64_t C, int64_t H) {
  WEFT_CHECK(B >= 0 && Tn >= 0 && C > 0 && H > 0, "attention: bad sizes B=", B, " T=", Tn, " C=", C,
             " H=", H);
  WEFT_CHECK(C % H == 0, "attention: C=", C, " is not divisible by H=", H);
}

// Row t of the scores holds valid entries [0, n) with n = t + 1; turns them into
// probabilities in place and zeroes [n, Tn) so the saved matrix is lower triangular.
template <typename T>
void causal_softmax_row(T* row, int64_t n, int64_t Tn) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] = detail::vexp(row[j] - mx);
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += double(row[j]);
  const T inv = T(1.0 / s);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
  std::fill(row + n, row + Tn, T(0));
}

}  // namespace

// qkv (B,T,3C), out (B,T,C), att (B,H,T,T).
template <typename T>
void attention_forward(const T* qkv, T* out, T* att, int64_t B, int64_t Tn, int64_t C, int64_t H) {
  check_attention_args(B, Tn, C, H);
  const int64_t hs = C / H, C3 = 3 * C;
  const T scale = T(1.0 / std::sqrt(double(hs)));
  const bool threads = detail::worth_threads(B * H * Tn * Tn * hs);
#pragma omp parallel for schedule(static) if (parallel : threads)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const T* Q = qkv + b * Tn * C3 + h * hs;  // (T,hs), row stride 3C
    const T* K = Q + C;
    const T* V = Q + 2 * C;
    T* A = att + bh * Tn * Tn;         // (T,T)
    T* O = out + b * Tn * C + h * hs;  // (T,hs), row stride C
    for (int64_t r0 = 0; r0 < Tn; r0 += kBlock) {
      const int64_t r1 = std::min(Tn, r0 + kBlock), rows = r1 - r0;
      // scores[r0:r1, 0:r1] = scale * Q[r0:r1] @ K[0:r1]^T
      gemm<T>(false, true, rows, r1, hs, scale, Q + r0 * C3, C3, K, C3, T(0), A + r0 * Tn, Tn);
      for (int64_t t = r0; t < r1; ++t) causal_softmax_row(A + t * Tn, t + 1, Tn);
      // out[r0:r1] = att[r0:r1, 0:r1] @ V[0:r1]
      gemm<T>(false, false, rows, hs, r1, T(1), A + r0 * Tn, Tn, V, C3, T(0), O + r0 * C, C);
    }
  }
}

// dV = att^T dout; datt = dout V^T; dpre = att * (datt - rowsum(datt * att));
// dQ = scale * dpre K; dK = scale * dpre^T Q.
template <typename T>
void attention_backward(const T* dout, const T* qkv, const T* att, T* dqkv, bool accumulate_dqkv,
                        int64_t B, int64_t Tn, int64_t C, int64_t H) {
  check_attention_args(B, Tn, C, H);
  const int64_t hs = C / H, C3 = 3 * C;
  const T scale = T(1.0 / std::sqrt(double(hs)));
  const T beta = accumulate_dqkv ? T(1) : T(0);
  const bool threads = detail::worth_threads(B * H * Tn * Tn * hs);
#pragma omp parallel if (parallel : threads)
  {
    std::vector<T> scratch(size_t(Tn * Tn));  // dpre for one (b,h), lower block triangle only
    T* D = scratch.data();
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const T* Q = qkv + b * Tn * C3 + h * hs;
      const T* K = Q + C;
      const T* V = Q + 2 * C;
      const T* A = att + bh * Tn * Tn;
      const T* dO = dout + b * Tn * C + h * hs;
      T* dQ = dqkv + b * Tn * C3 + h * hs;
      T* dK = dQ + C;
      T* dV = dQ + 2 * C;
      for (int64_t r0 = 0; r0 < Tn; r0 += kBlock) {
        const int64_t r1 = std::min(Tn, r0 + kBlock), rows = r1 - r0;
        // datt[r0:r1, 0:r1] = dout[r0:r1] @ V[0:r1]^T
        gemm<T>(false, true, rows, r1, hs, T(1), dO + r0 * C, C, V, C3, T(0), D + r0 * Tn, Tn);
        // Softmax backward in place over the causal part; the rest of the block is zero.
        for (int64_t t = r0; t < r1; ++t) {
          const T* a = A + t * Tn;
          T* d = D + t * Tn;
          double s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j <= t; ++j) s += double(d[j]) * double(a[j]);
          const T dot = T(s);
#pragma omp simd
          for (int64_t j = 0; j <= t; ++j) d[j] = a[j] * (d[j] - dot);
          std::fill(d + t + 1, d + r1, T(0));
        }
        // dQ[r0:r1] = scale * dpre[r0:r1, 0:r1] @ K[0:r1]
        gemm<T>(false, false, rows, hs, r1, scale, D + r0 * Tn, Tn, K, C3, beta, dQ + r0 * C3, C3);
      }
      // Key block [s0, s1) is used by query rows [s0, T) only.
      for (int64_t s0 = 0; s0 < Tn; s0 += kBlock) {
        const int64_t s1 = std::min(Tn, s0 + kBlock), cols = s1 - s0, rest = Tn - s0;
        // dK[s0:s1] = scale * dpre[s0:T, s0:s1]^T @ Q[s0:T]
        gemm<T>(true, false, cols, hs, rest, scale, D + s0 * Tn + s0, Tn, Q + s0 * C3, C3, beta,
                dK + s0 * C3, C3);
        // dV[s0:s1] = att[s0:T, s0:s1]^T @ dout[s0:T]
        gemm<T>(true, false, cols, hs, rest, T(1), A + s0 * Tn + s0, Tn, dO + s0 * C, C, beta,
                dV + s0 * C3, C3);
      }
    }
  }
}

template void attention_forward<float>(const float*, float*, float*, int64_t, int64_t, int64_t,
                                       int64_t);
template void attention_forward<double>(const double*, double*, double*, int64_t, int64_t, int64_t,
                                        int64_t);
template void attention_backward<float>(const float*, const float*, const float*, float*, bool,
                                        int64_t, int64_t, int64_t, int64_t);
template void attention_backward<double>(const double*, const double*, const double*, double*, bool,
                                         int64_t, int64_t, int64_t, int64_t);

}  // namespace weft::core::cpu
