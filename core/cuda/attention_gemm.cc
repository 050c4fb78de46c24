// Causal attention as the CPU computes it (core/cpu/attention.cc), on cuBLASLt: per batch
// element, the heads are strided-batched GEMMs (head h of q at column h*hs of its rows, so
// consecutive heads are hs elements apart). GPT's fused qkv and grouped-query attention
// share one implementation over strided q, k, v operands, as on the CPU.
#include <cmath>

#include "base/check.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"

namespace weft::core::cuda {
namespace {

// Where the operands live: batch b, row t, head h of q at q + (b*T + t)*ldq + h*hs (k, v
// and out likewise with their own row strides; gradients share their input's). Query head
// h reads KV head h / (H/KV), as PyTorch's repeat_interleave.
struct Layout {
  int64_t B, T, H, KV, hs, ldq, ldk, ldv, ldo;
};

Layout fused_layout(int64_t B, int64_t T, int64_t C, int64_t H) {
  WEFT_CHECK(B >= 0 && T >= 0 && C > 0 && H > 0 && C % H == 0, "attention: bad sizes B=", B,
             " T=", T, " C=", C, " H=", H);
  return Layout{B, T, H, H, C / H, 3 * C, 3 * C, 3 * C, C};
}

Layout gqa_layout(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hs) {
  WEFT_CHECK(B >= 0 && T >= 0 && H > 0 && KV > 0 && hs > 0, "gqa_attention: bad sizes B=", B,
             " T=", T, " H=", H, " KV=", KV, " hs=", hs);
  WEFT_CHECK(H % KV == 0, "gqa_attention: H=", H, " is not divisible by KV=", KV);
  return Layout{B, T, H, KV, hs, H * hs, KV * hs, KV * hs, H * hs};
}

// One strided-batched GEMM over `batch` heads: C_i = alpha op(A_i) op(B_i) + beta C_i.
void heads_gemm(BlasLt& blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                const bf16* A, int64_t lda, int64_t sa, const bf16* Bm, int64_t ldb, int64_t sb,
                float beta, void* C, bool c_f32, int64_t ldc, int64_t sc, int64_t batch,
                StreamHandle s) {
  GemmArgs g;
  g.trans_a = ta, g.trans_b = tb;
  g.M = M, g.N = N, g.K = K;
  g.alpha = alpha, g.beta = beta;
  g.A = A, g.lda = lda, g.stride_a = sa;
  g.B = Bm, g.ldb = ldb, g.stride_b = sb;
  g.C = C, g.c_f32 = c_f32, g.ldc = ldc, g.stride_c = sc;
  g.batch = batch;
  blas.gemm(g, s);
}

// Query heads h = g*group + j for g in [0, KV) are `group` heads apart and read KV head g,
// so for each j in [0, group) one GEMM batched over the KV heads covers them: query-side
// strides group*hs (columns) and group*T*T (att, scores), KV-side stride hs. With KV = H
// (GPT) that is one GEMM over all heads, the calls of the GPT-only version.
void causal_forward(BlasLt& blas, const Layout& L, const bf16* q, const bf16* k, const bf16* v,
                    bf16* out, bf16* att, float* scores, StreamHandle s) {
  if (L.B * L.T == 0) return;
  const int64_t T = L.T, hs = L.hs, TT = T * T, group = L.H / L.KV;
  const float scale = float(1.0 / std::sqrt(double(hs)));  // as the CPU: 1/sqrt(hs)
  for (int64_t b = 0; b < L.B; ++b) {
    const bf16* Q = q + b * T * L.ldq;
    const bf16* K = k + b * T * L.ldk;
    const bf16* V = v + b * T * L.ldv;
    bf16* P = att + b * L.H * TT;
    bf16* O = out + b * T * L.ldo;
    // scores_h (T,T) = scale * Q_h K_g^T, all T x T (the masked half is computed and dropped)
    for (int64_t j = 0; j < group; ++j)
      heads_gemm(blas, false, true, T, T, hs, scale, Q + j * hs, L.ldq, group * hs, K, L.ldk, hs,
                 0.0f, scores + j * TT, true, T, group * TT, L.KV, s);
    causal_softmax_forward(scores, P, L.H * T, T, s);
    // out_h (T,hs) = P_h V_g, written into head h's columns of out
    for (int64_t j = 0; j < group; ++j)
      heads_gemm(blas, false, false, T, hs, T, 1.0f, P + j * TT, T, group * TT, V, L.ldv, hs, 0.0f,
                 O + j * hs, false, L.ldo, group * hs, L.KV, s);
  }
}

// dK_g and dV_g sum over the group's query heads: the first j writes them (or adds, when
// accumulating), the others add (beta 1), so each KV head's gradient is rounded to bf16
// once per query head of its group (the CPU sums in its own precision).
void causal_backward(BlasLt& blas, const Layout& L, const bf16* dout, const bf16* q, const bf16* k,
                     const bf16* v, const bf16* att, bf16* dq, bf16* dk, bf16* dv, bool accumulate,
                     float* dscores, bf16* ds, StreamHandle s) {
  if (L.B * L.T == 0) return;
  const int64_t T = L.T, hs = L.hs, TT = T * T, group = L.H / L.KV;
  const float scale = float(1.0 / std::sqrt(double(hs)));
  const float beta = accumulate ? 1.0f : 0.0f;
  for (int64_t b = 0; b < L.B; ++b) {
    const bf16* Q = q + b * T * L.ldq;
    const bf16* K = k + b * T * L.ldk;
    const bf16* V = v + b * T * L.ldv;
    const bf16* P = att + b * L.H * TT;
    const bf16* dO = dout + b * T * L.ldo;
    bf16* dQ = dq + b * T * L.ldq;
    bf16* dK = dk + b * T * L.ldk;
    bf16* dV = dv + b * T * L.ldv;
    // datt_h (T,T) = dout_h V_g^T, then the softmax backward over the causal part
    for (int64_t j = 0; j < group; ++j)
      heads_gemm(blas, false, true, T, T, hs, 1.0f, dO + j * hs, L.ldo, group * hs, V, L.ldv, hs,
                 0.0f, dscores + j * TT, true, T, group * TT, L.KV, s);
    causal_softmax_backward(dscores, P, ds, L.H * T, T, s);
    // dQ_h = scale * dS_h K_g;  dK_g = scale * sum_h dS_h^T Q_h;  dV_g = sum_h P_h^T dout_h
    for (int64_t j = 0; j < group; ++j) {
      const float kv_beta = j == 0 ? beta : 1.0f;
      heads_gemm(blas, false, false, T, hs, T, scale, ds + j * TT, T, group * TT, K, L.ldk, hs,
                 beta, dQ + j * hs, false, L.ldq, group * hs, L.KV, s);
      heads_gemm(blas, true, false, T, hs, T, scale, ds + j * TT, T, group * TT, Q + j * hs, L.ldq,
                 group * hs, kv_beta, dK, false, L.ldk, hs, L.KV, s);
      heads_gemm(blas, true, false, T, hs, T, 1.0f, P + j * TT, T, group * TT, dO + j * hs, L.ldo,
                 group * hs, kv_beta, dV, false, L.ldv, hs, L.KV, s);
    }
  }
}

}  // namespace

size_t attention_gemm_workspace(int64_t T, int64_t H) {
  return size_t(std::max<int64_t>(1, H * T * T));
}

void attention_gemm_forward(BlasLt& blas, const bf16* qkv, bf16* out, bf16* att, float* scores,
                            int64_t B, int64_t T, int64_t C, int64_t H, StreamHandle s) {
  const Layout L = fused_layout(B, T, C, H);
  causal_forward(blas, L, qkv, qkv + C, qkv + 2 * C, out, att, scores, s);
}

void attention_gemm_backward(BlasLt& blas, const bf16* dout, const bf16* qkv, const bf16* att,
                             bf16* dqkv, bool accumulate_dqkv, float* dscores, bf16* ds, int64_t B,
                             int64_t T, int64_t C, int64_t H, StreamHandle s) {
  const Layout L = fused_layout(B, T, C, H);
  causal_backward(blas, L, dout, qkv, qkv + C, qkv + 2 * C, att, dqkv, dqkv + C, dqkv + 2 * C,
                  accumulate_dqkv, dscores, ds, s);
}

void gqa_attention_gemm_forward(BlasLt& blas, const bf16* q, const bf16* k, const bf16* v,
                                bf16* out, bf16* att, float* scores, int64_t B, int64_t T,
                                int64_t H, int64_t KV, int64_t hs, StreamHandle s) {
  causal_forward(blas, gqa_layout(B, T, H, KV, hs), q, k, v, out, att, scores, s);
}

void gqa_attention_gemm_backward(BlasLt& blas, const bf16* dout, const bf16* q, const bf16* k,
                                 const bf16* v, const bf16* att, bf16* dq, bf16* dk, bf16* dv,
                                 bool accumulate, float* dscores, bf16* ds, int64_t B, int64_t T,
                                 int64_t H, int64_t KV, int64_t hs, StreamHandle s) {
  causal_backward(blas, gqa_layout(B, T, H, KV, hs), dout, q, k, v, att, dq, dk, dv, accumulate,
                  dscores, ds, s);
}

}  // namespace weft::core::cuda
