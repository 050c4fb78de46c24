// Causal self-attention for one (batch, head) pair at a time, parallel over pairs.
// The sequence is cut into blocks of kBlock rows; row block [r0, r1) only needs keys
// [0, r1), so the GEMMs skip the blocks above the diagonal (3/8 fewer flops at
// T = 256 than full T x T products).
// GPT's fused qkv and grouped-query attention (KV heads each serving H/KV query heads)
// share one implementation over strided q, k, v operands; with KV = H it makes the same
// GEMM calls on the same pointers as before, so GPT's results keep their bits.
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

// Where the operands live: batch b, row t, head h of q starts at q + (b*T + t)*ldq + h*hs
// (likewise k and v with their own strides, out with ldo); the gradients share the strides
// of their inputs. Query head h reads KV head h / (H/KV), as repeat_interleave in PyTorch.
struct Layout {
  int64_t B, Tn, H, KV, hs, ldq, ldk, ldv, ldo;
};

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

// att (B,H,T,T). Parallel over (b, query head): pairs only read shared K and V.
template <typename T>
void causal_forward(const Layout& L, const T* q, const T* k, const T* v, T* out, T* att) {
  const int64_t Tn = L.Tn, hs = L.hs, group = L.H / L.KV;
  const T scale = T(1.0 / std::sqrt(double(hs)));
  const bool threads = detail::worth_threads(L.B * L.H * Tn * Tn * hs);
#pragma omp parallel for schedule(static) if (parallel : threads)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const int64_t b = bh / L.H, h = bh % L.H, kh = h / group;
    const T* Q = q + b * Tn * L.ldq + h * hs;  // (T,hs), row stride ldq
    const T* K = k + b * Tn * L.ldk + kh * hs;
    const T* V = v + b * Tn * L.ldv + kh * hs;
    T* A = att + bh * Tn * Tn;             // (T,T)
    T* O = out + b * Tn * L.ldo + h * hs;  // (T,hs), row stride ldo
    for (int64_t r0 = 0; r0 < Tn; r0 += kBlock) {
      const int64_t r1 = std::min(Tn, r0 + kBlock), rows = r1 - r0;
      // scores[r0:r1, 0:r1] = scale * Q[r0:r1] @ K[0:r1]^T
      gemm<T>(false, true, rows, r1, hs, scale, Q + r0 * L.ldq, L.ldq, K, L.ldk, T(0), A + r0 * Tn,
              Tn);
      for (int64_t t = r0; t < r1; ++t) causal_softmax_row(A + t * Tn, t + 1, Tn);
      // out[r0:r1] = att[r0:r1, 0:r1] @ V[0:r1]
      gemm<T>(false, false, rows, hs, r1, T(1), A + r0 * Tn, Tn, V, L.ldv, T(0), O + r0 * L.ldo,
              L.ldo);
    }
  }
}

// dV = att^T dout; datt = dout V^T; dpre = att * (datt - rowsum(datt * att));
// dQ = scale * dpre K; dK = scale * dpre^T Q.
// Parallel over (b, KV head): one thread owns dK and dV of its KV head and adds the
// contributions of the group's query heads in a fixed order, so the sum is race-free and
// gives the same bits for every thread count.
template <typename T>
void causal_backward(const Layout& L, const T* dout, const T* q, const T* k, const T* v,
                     const T* att, T* dq, T* dk, T* dv, bool accumulate) {
  const int64_t Tn = L.Tn, hs = L.hs, group = L.H / L.KV;
  const T scale = T(1.0 / std::sqrt(double(hs)));
  const T beta = accumulate ? T(1) : T(0);
  const bool threads = detail::worth_threads(L.B * L.H * Tn * Tn * hs);
#pragma omp parallel if (parallel : threads)
  {
    std::vector<T> scratch(size_t(Tn * Tn));  // dpre for one (b,h), lower block triangle only
    T* D = scratch.data();
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < L.B * L.KV; ++bk) {
      const int64_t b = bk / L.KV, kh = bk % L.KV;
      const T* K = k + b * Tn * L.ldk + kh * hs;
      const T* V = v + b * Tn * L.ldv + kh * hs;
      T* dK = dk + b * Tn * L.ldk + kh * hs;
      T* dV = dv + b * Tn * L.ldv + kh * hs;
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        const T* Q = q + b * Tn * L.ldq + h * hs;
        const T* A = att + (b * L.H + h) * Tn * Tn;
        const T* dO = dout + b * Tn * L.ldo + h * hs;
        T* dQ = dq + b * Tn * L.ldq + h * hs;
        // The group's first query head writes dK and dV (or adds when accumulating).
        const T kv_beta = h == kh * group ? beta : T(1);
        for (int64_t r0 = 0; r0 < Tn; r0 += kBlock) {
          const int64_t r1 = std::min(Tn, r0 + kBlock), rows = r1 - r0;
          // datt[r0:r1, 0:r1] = dout[r0:r1] @ V[0:r1]^T
          gemm<T>(false, true, rows, r1, hs, T(1), dO + r0 * L.ldo, L.ldo, V, L.ldv, T(0),
                  D + r0 * Tn, Tn);
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
          gemm<T>(false, false, rows, hs, r1, scale, D + r0 * Tn, Tn, K, L.ldk, beta,
                  dQ + r0 * L.ldq, L.ldq);
        }
        // Key block [s0, s1) is used by query rows [s0, T) only.
        for (int64_t s0 = 0; s0 < Tn; s0 += kBlock) {
          const int64_t s1 = std::min(Tn, s0 + kBlock), cols = s1 - s0, rest = Tn - s0;
          // dK[s0:s1] = scale * dpre[s0:T, s0:s1]^T @ Q[s0:T]
          gemm<T>(true, false, cols, hs, rest, scale, D + s0 * Tn + s0, Tn, Q + s0 * L.ldq, L.ldq,
                  kv_beta, dK + s0 * L.ldk, L.ldk);
          // dV[s0:s1] = att[s0:T, s0:s1]^T @ dout[s0:T]
          gemm<T>(true, false, cols, hs, rest, T(1), A + s0 * Tn + s0, Tn, dO + s0 * L.ldo, L.ldo,
                  kv_beta, dV + s0 * L.ldv, L.ldv);
        }
      }
    }
  }
}

Layout fused_layout(int64_t B, int64_t Tn, int64_t C, int64_t H) {
  WEFT_CHECK(B >= 0 && Tn >= 0 && C > 0 && H > 0, "attention: bad sizes B=", B, " T=", Tn, " C=", C,
             " H=", H);
  WEFT_CHECK(C % H == 0, "attention: C=", C, " is not divisible by H=", H);
  return Layout{B, Tn, H, H, C / H, 3 * C, 3 * C, 3 * C, C};
}

Layout gqa_layout(int64_t B, int64_t Tn, int64_t H, int64_t KV, int64_t hs) {
  WEFT_CHECK(B >= 0 && Tn >= 0 && H > 0 && KV > 0 && hs > 0, "gqa_attention: bad sizes B=", B,
             " T=", Tn, " H=", H, " KV=", KV, " hs=", hs);
  WEFT_CHECK(H % KV == 0, "gqa_attention: H=", H, " is not divisible by KV=", KV);
  return Layout{B, Tn, H, KV, hs, H * hs, KV * hs, KV * hs, H * hs};
}

}  // namespace

// qkv (B,T,3C), out (B,T,C), att (B,H,T,T).
template <typename T>
void attention_forward(const T* qkv, T* out, T* att, int64_t B, int64_t Tn, int64_t C, int64_t H) {
  const Layout L = fused_layout(B, Tn, C, H);
  causal_forward(L, qkv, qkv + C, qkv + 2 * C, out, att);
}

template <typename T>
void attention_backward(const T* dout, const T* qkv, const T* att, T* dqkv, bool accumulate_dqkv,
                        int64_t B, int64_t Tn, int64_t C, int64_t H) {
  const Layout L = fused_layout(B, Tn, C, H);
  causal_backward(L, dout, qkv, qkv + C, qkv + 2 * C, att, dqkv, dqkv + C, dqkv + 2 * C,
                  accumulate_dqkv);
}

// q (B,T,H*hs), k and v (B,T,KV*hs), out (B,T,H*hs), att (B,H,T,T).
template <typename T>
void gqa_attention_forward(const T* q, const T* k, const T* v, T* out, T* att, int64_t B,
                           int64_t Tn, int64_t H, int64_t KV, int64_t hs) {
  causal_forward(gqa_layout(B, Tn, H, KV, hs), q, k, v, out, att);
}

template <typename T>
void gqa_attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* att, T* dq,
                            T* dk, T* dv, bool accumulate, int64_t B, int64_t Tn, int64_t H,
                            int64_t KV, int64_t hs) {
  causal_backward(gqa_layout(B, Tn, H, KV, hs), dout, q, k, v, att, dq, dk, dv, accumulate);
}

template void attention_forward<float>(const float*, float*, float*, int64_t, int64_t, int64_t,
                                       int64_t);
template void attention_forward<double>(const double*, double*, double*, int64_t, int64_t, int64_t,
                                        int64_t);
template void attention_backward<float>(const float*, const float*, const float*, float*, bool,
                                        int64_t, int64_t, int64_t, int64_t);
template void attention_backward<double>(const double*, const double*, const double*, double*, bool,
                                         int64_t, int64_t, int64_t, int64_t);
template void gqa_attention_forward<float>(const float*, const float*, const float*, float*, float*,
                                           int64_t, int64_t, int64_t, int64_t, int64_t);
template void gqa_attention_forward<double>(const double*, const double*, const double*, double*,
                                            double*, int64_t, int64_t, int64_t, int64_t, int64_t);
template void gqa_attention_backward<float>(const float*, const float*, const float*, const float*,
                                            const float*, float*, float*, float*, bool, int64_t,
                                            int64_t, int64_t, int64_t, int64_t);
template void gqa_attention_backward<double>(const double*, const double*, const double*,
                                             const double*, const double*, double*, double*,
                                             double*, bool, int64_t, int64_t, int64_t, int64_t,
                                             int64_t);

}  // namespace weft::core::cpu
