// Causal attention as the CPU computes it (core/cpu/attention.cc), on cuBLASLt: per batch
// element, the H heads are one strided-batched GEMM (head h of q at column h*hs of the
// (T, 3C) rows, so consecutive heads are hs elements apart).
#include <cmath>

#include "base/check.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"

namespace weft::core::cuda {
namespace {

void check_args(int64_t B, int64_t T, int64_t C, int64_t H) {
  WEFT_CHECK(B >= 0 && T >= 0 && C > 0 && H > 0 && C % H == 0, "attention: bad sizes B=", B,
             " T=", T, " C=", C, " H=", H);
}

// One strided-batched GEMM over the H heads: C_h = alpha op(A_h) op(B_h) + beta C_h.
void heads_gemm(BlasLt& blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                const bf16* A, int64_t lda, int64_t sa, const bf16* Bm, int64_t ldb, int64_t sb,
                float beta, void* C, bool c_f32, int64_t ldc, int64_t sc, int64_t H,
                StreamHandle s) {
  GemmArgs g;
  g.trans_a = ta, g.trans_b = tb;
  g.M = M, g.N = N, g.K = K;
  g.alpha = alpha, g.beta = beta;
  g.A = A, g.lda = lda, g.stride_a = sa;
  g.B = Bm, g.ldb = ldb, g.stride_b = sb;
  g.C = C, g.c_f32 = c_f32, g.ldc = ldc, g.stride_c = sc;
  g.batch = H;
  blas.gemm(g, s);
}

}  // namespace

size_t attention_gemm_workspace(int64_t T, int64_t H) {
  return size_t(std::max<int64_t>(1, H * T * T));
}

void attention_gemm_forward(BlasLt& blas, const bf16* qkv, bf16* out, bf16* att, float* scores,
                            int64_t B, int64_t T, int64_t C, int64_t H, StreamHandle s) {
  check_args(B, T, C, H);
  if (B * T == 0) return;
  const int64_t hs = C / H, C3 = 3 * C, TT = T * T;
  const float scale = float(1.0 / std::sqrt(double(hs)));  // as the CPU: 1/sqrt(hs)
  for (int64_t b = 0; b < B; ++b) {
    const bf16* Q = qkv + b * T * C3;
    const bf16* K = Q + C;
    const bf16* V = Q + 2 * C;
    bf16* P = att + b * H * TT;
    // scores_h (T,T) = scale * Q_h K_h^T, all T x T (the masked half is computed and dropped)
    heads_gemm(blas, false, true, T, T, hs, scale, Q, C3, hs, K, C3, hs, 0.0f, scores, true, T, TT,
               H, s);
    causal_softmax_forward(scores, P, H * T, T, s);
    // out_h (T,hs) = P_h V_h, written into head h's columns of out (B,T,C)
    heads_gemm(blas, false, false, T, hs, T, 1.0f, P, T, TT, V, C3, hs, 0.0f, out + b * T * C,
               false, C, hs, H, s);
  }
}

void attention_gemm_backward(BlasLt& blas, const bf16* dout, const bf16* qkv, const bf16* att,
                             bf16* dqkv, bool accumulate_dqkv, float* dscores, bf16* ds, int64_t B,
                             int64_t T, int64_t C, int64_t H, StreamHandle s) {
  check_args(B, T, C, H);
  if (B * T == 0) return;
  const int64_t hs = C / H, C3 = 3 * C, TT = T * T;
  const float scale = float(1.0 / std::sqrt(double(hs)));
  const float beta = accumulate_dqkv ? 1.0f : 0.0f;
  for (int64_t b = 0; b < B; ++b) {
    const bf16* Q = qkv + b * T * C3;
    const bf16* K = Q + C;
    const bf16* V = Q + 2 * C;
    const bf16* P = att + b * H * TT;
    const bf16* dO = dout + b * T * C;
    bf16* dQ = dqkv + b * T * C3;
    bf16* dK = dQ + C;
    bf16* dV = dQ + 2 * C;
    // datt_h (T,T) = dout_h V_h^T, then the softmax backward over the causal part
    heads_gemm(blas, false, true, T, T, hs, 1.0f, dO, C, hs, V, C3, hs, 0.0f, dscores, true, T, TT,
               H, s);
    causal_softmax_backward(dscores, P, ds, H * T, T, s);
    // dQ_h = scale * dS_h K_h;  dK_h = scale * dS_h^T Q_h;  dV_h = P_h^T dout_h
    heads_gemm(blas, false, false, T, hs, T, scale, ds, T, TT, K, C3, hs, beta, dQ, false, C3, hs,
               H, s);
    heads_gemm(blas, true, false, T, hs, T, scale, ds, T, TT, Q, C3, hs, beta, dK, false, C3, hs, H,
               s);
    heads_gemm(blas, true, false, T, hs, T, 1.0f, P, T, TT, dO, C, hs, beta, dV, false, C3, hs, H,
               s);
  }
}

}  // namespace weft::core::cuda
