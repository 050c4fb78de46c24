// CPU reference kernels: the readable, fast-enough path every other device is
// checked against. Raw-pointer API over contiguous row-major buffers, templated on
// the element type (float for training, double for gradient checks).
//
// Shapes are named once (llm.c style): B batch, T sequence, C channels, H heads,
// hs = C/H head size, KV key/value heads (grouped-query attention), V vocabulary,
// N = B*T rows, and comments use them.
//
// Convention for gradient outputs: `accumulate == false` overwrites the output,
// `true` adds into it (GEMM beta = 1). Parameter gradients always accumulate, so
// micro-batches and tied weights sum for free; autodiff chooses the flag for
// activation gradients (the first contribution overwrites).
//
// Threads: every kernel parallelises with OpenMP over rows/batches with a static
// partition, so results are bitwise reproducible for a fixed thread count. Reductions
// over rows (bias, LayerNorm and embedding gradients, sum_squares, the mean loss) give
// the same bits for every thread count.
//
// Optional pointers (documented "may be null") are typed std::type_identity_t<T>* so
// that a plain `nullptr` argument does not take part in deducing T.
#pragma once

#include <cstdint>
#include <type_traits>

namespace weft::core::cpu {

// ---- GEMM (OpenBLAS) -------------------------------------------------------
// C(M,N) = alpha * op(A) * op(B) + beta * C, row-major; op(X) = X or X^T.
// A is (M,K) (or (K,M) when trans_a), B is (K,N) (or (N,K) when trans_b).
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
// `batch` independent GEMMs with element strides between consecutive matrices.
template <typename T>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta,
                  T* C, int64_t ldc, int64_t stride_c, int64_t batch);

// ---- Linear: y(N,out) = x(N,in) @ w(out,in)^T + b(out) --------------------
// b may be null (no bias).
template <typename T>
void linear_forward(const T* x, const T* w, const std::type_identity_t<T>* b, T* y, int64_t N,
                    int64_t in, int64_t out);
// dx(N,in) = dy @ w (skipped when dx is null); dw(out,in) += dy^T @ x; db(out) += sum_rows(dy)
// (dw, db skipped when null). dw and db always accumulate.
template <typename T>
void linear_backward(const T* dy, const T* x, const T* w, std::type_identity_t<T>* dx,
                     bool accumulate_dx, std::type_identity_t<T>* dw, std::type_identity_t<T>* db,
                     int64_t N, int64_t in, int64_t out);

// ---- LayerNorm over the last dim C, eps inside the sqrt ---------------------
// x, y (N,C); w, b (C). Saves mean(N) and rstd(N) for the backward pass.
// Backward: dx skipped when null; dw(C) += sum_n dy*xhat, db(C) += sum_n dy, each
// skipped when null.
template <typename T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t N,
                       int64_t C, T eps);
template <typename T>
void layernorm_backward(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                        std::type_identity_t<T>* dx, bool accumulate_dx,
                        std::type_identity_t<T>* dw, std::type_identity_t<T>* db, int64_t N,
                        int64_t C);

// ---- RMSNorm over the last dim C (Llama), eps inside the sqrt ----------------
// y = x / sqrt(mean(x^2) + eps) * w; x, y (N,C); w (C). Saves rstd(N) for the backward.
// Backward: dx skipped when null; dw(C) += sum_n dy * x * rstd, skipped when null.
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t C, T eps);
template <typename T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd,
                      std::type_identity_t<T>* dx, bool accumulate_dx,
                      std::type_identity_t<T>* dw, int64_t N, int64_t C);

// ---- Rotary position embedding, rotate-half convention (Hugging Face Llama) ------
// x, y (B,T,heads*hs), hs even. Position t = row index within the sequence; pair j of a
// head is (j, j + hs/2) with angle t * theta^(-2j/hs) (computed in double):
// y[j] = x[j] cos - x[j+hs/2] sin, y[j+hs/2] = x[j+hs/2] cos + x[j] sin.
// y may equal x (in place). Applied to q (heads = H) and k (heads = KV) separately.
template <typename T>
void rope_forward(const T* x, T* y, int64_t B, int64_t Tn, int64_t heads, int64_t hs,
                  double theta);
// dx = the inverse rotation of dy (the rotation is orthogonal). dx may equal dy only when
// accumulate_dx is false.
template <typename T>
void rope_backward(const T* dy, T* dx, bool accumulate_dx, int64_t B, int64_t Tn, int64_t heads,
                   int64_t hs, double theta);

// ---- GELU, tanh approximation ----------------------------------------------
template <typename T>
void gelu_forward(const T* x, T* y, int64_t n);
template <typename T>
void gelu_backward(const T* dy, const T* x, T* dx, bool accumulate_dx, int64_t n);

// ---- SiLU-gated product (SwiGLU MLP): out = silu(gate) * up, silu(g) = g * sigmoid(g) ----
// gate, up, out (n). Backward: dgate = dout * up * silu'(gate), dup = dout * silu(gate);
// both are written (or added to, when accumulate) together.
template <typename T>
void swiglu_forward(const T* gate, const T* up, T* out, int64_t n);
template <typename T>
void swiglu_backward(const T* dout, const T* gate, const T* up, T* dgate, T* dup, bool accumulate,
                     int64_t n);

// ---- Softmax over the last dim ---------------------------------------------
template <typename T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t cols);
// dx = y * (dy - sum(dy * y))
template <typename T>
void softmax_backward(const T* dy, const T* y, T* dx, bool accumulate_dx, int64_t rows,
                      int64_t cols);

// ---- Causal self-attention ---------------------------------------------------
// qkv (B,T,3C): q, k, v stacked in that order, heads contiguous inside each.
// out (B,T,C); att (B,H,T,T) keeps the softmax probabilities for the backward pass
// (entries above the diagonal are zero). Scale 1/sqrt(hs).
template <typename T>
void attention_forward(const T* qkv, T* out, T* att, int64_t B, int64_t Tn, int64_t C, int64_t H);
template <typename T>
void attention_backward(const T* dout, const T* qkv, const T* att, T* dqkv, bool accumulate_dqkv,
                        int64_t B, int64_t Tn, int64_t C, int64_t H);

// ---- Grouped-query causal self-attention (Llama) ---------------------------------
// q (B,T,H*hs), k and v (B,T,KV*hs), out (B,T,H*hs), heads contiguous in each row;
// H % KV == 0 and query head h uses KV head h / (H/KV) (PyTorch's repeat_interleave),
// without materialising the repeated K and V. att (B,H,T,T) as above; scale 1/sqrt(hs).
// With KV = H and q, k, v taken from GPT's qkv this is attention_forward.
template <typename T>
void gqa_attention_forward(const T* q, const T* k, const T* v, T* out, T* att, int64_t B,
                           int64_t Tn, int64_t H, int64_t KV, int64_t hs);
// dq (B,T,H*hs), dk and dv (B,T,KV*hs): dk and dv sum over the H/KV query heads of their
// group. `accumulate` applies to all three.
template <typename T>
void gqa_attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* att, T* dq,
                            T* dk, T* dv, bool accumulate, int64_t B, int64_t Tn, int64_t H,
                            int64_t KV, int64_t hs);

// ---- Embedding: out(B,T,C) = wte[tokens] + wpe[t] ------------------------------
// Token ids outside [0, V) throw InternalError (validated earlier with a clear message).
template <typename T>
void embedding_forward(const int32_t* tokens, const T* wte, const T* wpe, T* out, int64_t B,
                       int64_t Tn, int64_t C, int64_t V);
// dwte += scatter(dout), dwpe += sum over batch (each skipped when null).
// The ids were range-checked by the forward pass (V is not known here); negative ids
// still throw InternalError.
template <typename T>
void embedding_backward(const T* dout, const int32_t* tokens, std::type_identity_t<T>* dwte,
                        std::type_identity_t<T>* dwpe, int64_t B, int64_t Tn, int64_t C);

// ---- Cross-entropy with logits ----------------------------------------------
// losses(N) = logsumexp(logits[n]) - logits[n][target]; returns the mean over N.
// probs(N,V), when not null, receives softmax(logits) for the backward pass; losses may
// be null too. Targets outside [0, V) throw InternalError (forward and backward).
template <typename T>
double cross_entropy_forward(const T* logits, const int32_t* targets,
                             std::type_identity_t<T>* losses, std::type_identity_t<T>* probs,
                             int64_t N, int64_t V);
// dlogits = (softmax(logits) - onehot(target)) * dloss (dloss: gradient of each row's loss).
template <typename T>
void cross_entropy_backward(const T* probs, const int32_t* targets, T dloss, T* dlogits,
                            bool accumulate, int64_t N, int64_t V);

// ---- Vocabulary slices (vocabulary-parallel layouts) ----------------------------
// The table or the logits hold vocabulary entries [offset, offset+V) of the whole; ids are
// checked non-negative here and against the whole vocabulary by the caller.
// Embedding: tokens outside the slice contribute zero; wpe may be null (one slice adds it).
template <typename T>
void embedding_slice_forward(const int32_t* tokens, const T* wte, const std::type_identity_t<T>* wpe,
                             T* out, int64_t B, int64_t Tn, int64_t C, int64_t V, int64_t offset);
// dwte (V,C) += dout rows whose token falls in the slice; dwpe += sum over b (each may be null).
template <typename T>
void embedding_slice_backward(const T* dout, const int32_t* tokens, std::type_identity_t<T>* dwte,
                              std::type_identity_t<T>* dwpe, int64_t B, int64_t Tn, int64_t C, int64_t V,
                              int64_t offset);
// Cross-entropy over slices, in three passes with reductions across the slices between
// them: row_max (N) of the slice (then max); sum_exp (N) of exp(logit - row_max) and
// target_logit (N), the target's logit where it falls in the slice, else 0 (then sum);
// finally probs (N,V) = exp(logit - row_max) / sum_exp (may be null) and the returned mean
// loss row_max + log(sum_exp) - target_logit.
template <typename T>
void cross_entropy_slice_max(const T* logits, double* row_max, int64_t N, int64_t V);
template <typename T>
void cross_entropy_slice_sumexp(const T* logits, const int32_t* targets, const double* row_max,
                                double* sum_exp, double* target_logit, int64_t N, int64_t V, int64_t offset);
template <typename T>
double cross_entropy_slice_finish(const T* logits, const double* row_max, const double* sum_exp,
                                  const double* target_logit, std::type_identity_t<T>* probs, int64_t N,
                                  int64_t V);
// dlogits = (probs - onehot(target - offset)) * dloss; the one-hot only where the target
// falls in the slice.
template <typename T>
void cross_entropy_slice_backward(const T* probs, const int32_t* targets, T dloss, T* dlogits,
                                  bool accumulate, int64_t N, int64_t V, int64_t offset);

// ---- Element-wise --------------------------------------------------------------
template <typename T>
void add(const T* a, const T* b, T* y, int64_t n);  // y = a + b
template <typename T>
void axpy(T alpha, const T* x, T* y, int64_t n);  // y += alpha * x
template <typename T>
void scale(T alpha, T* y, int64_t n);  // y *= alpha
// Sum of squares in double, reduced in fixed-size blocks so the result is bitwise
// independent of the thread count.
template <typename T>
double sum_squares(const T* x, int64_t n);

// ---- AdamW (decoupled weight decay, bias-corrected) ----------------------------
// g is multiplied by grad_scale first (clipping). step counts from 1.
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;  // double: exact for the f64 instantiation too
  int64_t step;
  double grad_scale;
};
template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWParams& hp, bool decay);

// ---- Threads ---------------------------------------------------------------------
// Sets OpenMP and OpenBLAS thread counts (train.threads); 0 keeps the default.
void set_num_threads(int n);
int num_threads();

}  // namespace weft::core::cpu
