// CUDA kernels of the training ops, the device twins of core/cpu/kernels.h. Raw-pointer
// API over contiguous row-major device buffers, asynchronous on the given stream.
//
// Shapes as in core/cpu/kernels.h: B batch, T sequence, C channels, H heads, hs = C/H,
// V vocabulary, N = B*T rows.
//
// Mixed precision: activations and their gradients are bf16, every kernel computes in f32
// (row statistics and reductions too), parameter gradients, LayerNorm statistics, losses
// and optimizer state are f32. Each kernel states where it departs from the CPU
// semantics; otherwise it computes the same formula, so tests compare against the CPU
// reference with bf16 tolerances.
//
// Gradient outputs follow the CPU convention: `accumulate == false` overwrites, `true`
// adds; parameter gradients (f32) always accumulate.
//
// Argument checks run on the host before any launch and throw InternalError (or
// NotSupported for shapes a kernel does not cover); launch failures throw weft::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/dtype.h"

namespace weft::core::cuda {

using core::bf16;

// ---- casts and element-wise (elementwise.cu) ------------------------------------------
void cast_f32_to_bf16(const float* x, bf16* y, int64_t n, StreamHandle s);
void cast_bf16_to_f32(const bf16* x, float* y, int64_t n, StreamHandle s);
// y = a + b
void add(const bf16* a, const bf16* b, bf16* y, int64_t n, StreamHandle s);
// y += x (the accumulating half of add.bwd)
void accumulate(const bf16* x, bf16* y, int64_t n, StreamHandle s);
// GELU, tanh approximation, in the CPU's form x / (1 + e^(-2u)) with the exponent capped.
void gelu_forward(const bf16* x, bf16* y, int64_t n, StreamHandle s);
void gelu_backward(const bf16* dy, const bf16* x, bf16* dx, bool accumulate_dx, int64_t n,
                   StreamHandle s);
// out(cols) += sum over rows of x(rows, cols), in f32, in a fixed order (deterministic).
// `workspace` holds column_sum_workspace(rows, cols) floats.
size_t column_sum_workspace(int64_t rows, int64_t cols);
void column_sum(const bf16* x, int64_t rows, int64_t cols, float* out, float* workspace,
                StreamHandle s);

// ---- LayerNorm over the last dim C, eps inside the sqrt (layernorm.cu) ----------------
// x, y (N,C) bf16; w, b (C) bf16; mean, rstd (N) f32. Two-pass statistics in f32.
void layernorm_forward(const bf16* x, const bf16* w, const bf16* b, bf16* y, float* mean,
                       float* rstd, int64_t N, int64_t C, float eps, StreamHandle s);
// dx (may be null) as the CPU; dw(C) += sum_n dy*xhat and db(C) += sum_n dy in f32 (each
// may be null). `workspace` holds layernorm_backward_workspace(N, C) floats.
size_t layernorm_backward_workspace(int64_t N, int64_t C);
void layernorm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* mean,
                        const float* rstd, bf16* dx, bool accumulate_dx, float* dw, float* db,
                        int64_t N, int64_t C, float* workspace, StreamHandle s);

// ---- The Llama block's row and element-wise kernels (llama.cu) -------------------------
// Each comes as a bf16 overload (training) and an f32 one (same f32 arithmetic, so tests
// can check the formula tightly); shapes and semantics as core/cpu/kernels.h.
// RMSNorm: x, y (N,C), w (C); rstd (N) f32. The sum of squares is f32 (the CPU's double).
// Backward: dx (may be null) as the CPU; dw(C) += sum_n dy * x * rstd in f32, in a fixed
// order (may be null); `workspace` holds rmsnorm_backward_workspace(N, C) floats.
size_t rmsnorm_backward_workspace(int64_t N, int64_t C);
void rmsnorm_forward(const bf16* x, const bf16* w, bf16* y, float* rstd, int64_t N, int64_t C,
                     float eps, StreamHandle s);
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                     float eps, StreamHandle s);
void rmsnorm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, bf16* dx,
                      bool accumulate_dx, float* dw, int64_t N, int64_t C, float* workspace,
                      StreamHandle s);
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      bool accumulate_dx, float* dw, int64_t N, int64_t C, float* workspace,
                      StreamHandle s);
// Rotary embedding, rotate-half: x, y (B,T,heads*hs), hs even; cos and sin of each angle
// computed in double and rounded to f32, as the CPU's table. y may equal x. Backward
// rotates back; dx may equal dy only when not accumulating.
void rope_forward(const bf16* x, bf16* y, int64_t B, int64_t T, int64_t heads, int64_t hs,
                  double theta, StreamHandle s);
void rope_forward(const float* x, float* y, int64_t B, int64_t T, int64_t heads, int64_t hs,
                  double theta, StreamHandle s);
void rope_backward(const bf16* dy, bf16* dx, bool accumulate_dx, int64_t B, int64_t T,
                   int64_t heads, int64_t hs, double theta, StreamHandle s);
void rope_backward(const float* dy, float* dx, bool accumulate_dx, int64_t B, int64_t T,
                   int64_t heads, int64_t hs, double theta, StreamHandle s);
// SiLU-gated product out = silu(gate) * up (n); the backward writes (or adds to) both
// dgate and dup.
void swiglu_forward(const bf16* gate, const bf16* up, bf16* out, int64_t n, StreamHandle s);
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n, StreamHandle s);
void swiglu_backward(const bf16* dout, const bf16* gate, const bf16* up, bf16* dgate, bf16* dup,
                     bool accumulate, int64_t n, StreamHandle s);
void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate,
                     float* dup, bool accumulate, int64_t n, StreamHandle s);

// ---- Softmax and cross-entropy (softmax_ce.cu) ----------------------------------------
void softmax_forward(const bf16* x, bf16* y, int64_t rows, int64_t cols, StreamHandle s);
// dx = y * (dy - sum(dy * y))
void softmax_backward(const bf16* dy, const bf16* y, bf16* dx, bool accumulate_dx, int64_t rows,
                      int64_t cols, StreamHandle s);
// losses(N) f32 = logsumexp(logits[n]) - logits[n][target]; probs(N,V) bf16 = softmax;
// mean_loss(1) f32 = mean of losses, summed in row order. Targets must be in [0, V) (the
// executor checks them on the host before upload); an id outside gives a NaN loss.
void cross_entropy_forward(const bf16* logits, const int32_t* targets, float* losses, bf16* probs,
                           float* mean_loss, int64_t N, int64_t V, StreamHandle s);
// dlogits = (probs - onehot(target)) * dloss
void cross_entropy_backward(const bf16* probs, const int32_t* targets, float dloss, bf16* dlogits,
                            bool accumulate, int64_t N, int64_t V, StreamHandle s);

// ---- Embedding (embedding.cu) ----------------------------------------------------------
// out(B,T,C) = wte[tokens] + wpe[t] (wpe may be null: no position table); ids are checked
// on the host before upload.
void embedding_forward(const int32_t* tokens, const bf16* wte, const bf16* wpe, bf16* out,
                       int64_t B, int64_t T, int64_t C, StreamHandle s);
// dwte(V,C) += scatter(dout) (f32 atomics: the order of the adds varies from run to run),
// dwpe(T,C) += sum over batch (fixed order). Either may be null.
void embedding_backward(const bf16* dout, const int32_t* tokens, float* dwte, float* dwpe,
                        int64_t B, int64_t T, int64_t C, StreamHandle s);

// ---- Fused causal attention (attention.cu) ---------------------------------------------
// qkv (B,T,3C) as the CPU; out (B,T,C); lse (B,H,T) f32 keeps the log-sum-exp of each
// score row instead of the (B,H,T,T) probabilities, so memory is linear in T (flash
// attention). Head sizes 16, 32 and 64 (NotSupported otherwise).
bool attention_supported(int64_t C, int64_t H);
void attention_forward(const bf16* qkv, bf16* out, float* lse, int64_t B, int64_t T, int64_t C,
                       int64_t H, StreamHandle s);
// dqkv as the CPU, the probabilities recomputed from qkv and lse; `workspace` holds
// attention_backward_workspace() floats.
size_t attention_backward_workspace(int64_t B, int64_t T, int64_t H);
void attention_backward(const bf16* dout, const bf16* qkv, const float* lse, bf16* dqkv,
                        bool accumulate_dqkv, float* workspace, int64_t B, int64_t T, int64_t C,
                        int64_t H, StreamHandle s);

// ---- Attention through cuBLASLt (attention_gemm.cc, softmax_ce.cu) ---------------------
// The CPU's algorithm on tensor cores, one batch element at a time, its H heads as one
// strided-batched GEMM: S = scale Q K^T (f32 scratch), P = causal softmax saved in att
// (B,H,T,T) bf16 (zeros above the diagonal, as the CPU's att), out = P V. Memory O(T^2)
// per head, where the flash kernel above is O(T); faster while that one runs on CUDA cores.
class BlasLt;
// Floats of f32 scratch for one batch element's scores (forward) or dP (backward).
size_t attention_gemm_workspace(int64_t T, int64_t H);
void attention_gemm_forward(BlasLt& blas, const bf16* qkv, bf16* out, bf16* att, float* scores,
                            int64_t B, int64_t T, int64_t C, int64_t H, StreamHandle s);
// `dscores` holds attention_gemm_workspace() floats, `ds` H*T*T bf16.
void attention_gemm_backward(BlasLt& blas, const bf16* dout, const bf16* qkv, const bf16* att,
                             bf16* dqkv, bool accumulate_dqkv, float* dscores, bf16* ds, int64_t B,
                             int64_t T, int64_t C, int64_t H, StreamHandle s);
// Grouped-query attention (Llama) on the same path: q (B,T,H*hs), k and v (B,T,KV*hs),
// out (B,T,H*hs), att (B,H,T,T) bf16 as above; H % KV == 0 and query head h reads KV head
// h / (H/KV) in place (no repeated K and V): for each of the H/KV positions within a group,
// one GEMM strided over the KV heads. `scores` holds attention_gemm_workspace(T, H) floats.
void gqa_attention_gemm_forward(BlasLt& blas, const bf16* q, const bf16* k, const bf16* v,
                                bf16* out, bf16* att, float* scores, int64_t B, int64_t T,
                                int64_t H, int64_t KV, int64_t hs, StreamHandle s);
// dq (B,T,H*hs), dk and dv (B,T,KV*hs), `accumulate` for all three. dk and dv sum over the
// group's query heads by GEMMs with beta 1 into the bf16 output, so they are rounded once
// per query head of the group (once per call when KV = H). `dscores` holds
// attention_gemm_workspace(T, H) floats, `ds` H*T*T bf16.
void gqa_attention_gemm_backward(BlasLt& blas, const bf16* dout, const bf16* q, const bf16* k,
                                 const bf16* v, const bf16* att, bf16* dq, bf16* dk, bf16* dv,
                                 bool accumulate, float* dscores, bf16* ds, int64_t B, int64_t T,
                                 int64_t H, int64_t KV, int64_t hs, StreamHandle s);
// Row r of (rows, T), rows a multiple of T, is query r % T: softmax over keys [0, r % T],
// zeros above. Backward: dS = P (dP - sum(dP P)) over the same keys.
void causal_softmax_forward(const float* S, bf16* P, int64_t rows, int64_t T, StreamHandle s);
void causal_softmax_backward(const float* dP, const bf16* P, bf16* dS, int64_t rows, int64_t T,
                             StreamHandle s);

// ---- Optimizer (optim.cu): multi-tensor launches ---------------------------------------
// One parameter for AdamW: f32 master p, gradient g, moments m and v (n elements each),
// and optionally its bf16 compute copy, rewritten from the updated p in the same pass.
struct AdamWTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  bf16* p_bf16;  // may be null
  int64_t n;
  bool decay;
};
// The CPU's AdamW (core/cpu/adamw.cc) on every tensor of `list`, with the gradient scale
// min(1, grad_clip / (*norm + 1e-6)) read from device memory (grad_clip <= 0: scale 1), so
// clipping needs no host round trip. step counts from 1.
struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay, grad_clip;
  int64_t step;
};
void adamw_multi(const std::vector<AdamWTensor>& list, const AdamWHyper& hp, const double* norm,
                 StreamHandle s);
// *out = sqrt(sum of squares of every tensor), accumulated in double in a fixed order.
// `workspace` holds sum_squares_workspace(sizes) doubles.
size_t sum_squares_workspace(const std::vector<int64_t>& sizes);
void global_norm(const std::vector<const float*>& tensors, const std::vector<int64_t>& sizes,
                 double* out, double* workspace, StreamHandle s);

}  // namespace weft::core::cuda
