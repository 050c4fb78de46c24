// Row softmax and cross-entropy with logits: one block per row, statistics in f32 after
// subtracting the row maximum; the mean loss is reduced in a fixed order.
#include "core/cuda/common.cuh"

namespace weft::core::cuda {
namespace {

using detail::ld;
using detail::st;

constexpr int kThreads = 512;

__global__ void k_softmax_fwd(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t cols) {
  __shared__ float scratch[32];
  const __nv_bfloat16* xr = x + blockIdx.x * cols;
  __nv_bfloat16* yr = y + blockIdx.x * cols;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, ld(xr, c));
  mx = detail::block_max(mx, scratch);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(ld(xr, c) - mx);
  const float inv = 1.0f / detail::block_sum(s, scratch);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) st(yr, c, __expf(ld(xr, c) - mx) * inv);
}

__global__ void k_softmax_bwd(const __nv_bfloat16* dy, const __nv_bfloat16* y, __nv_bfloat16* dx,
                              bool acc, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t off = blockIdx.x * cols;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += ld(dy, off + c) * ld(y, off + c);
  const float dot = detail::block_sum(s, scratch);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = ld(y, off + c) * (ld(dy, off + c) - dot);
    st(dx, off + c, acc ? ld(dx, off + c) + v : v);
  }
}

__global__ void k_ce_fwd(const __nv_bfloat16* logits, const int32_t* targets, float* losses,
                         __nv_bfloat16* probs, int64_t V) {
  __shared__ float scratch[32];
  const int64_t n = blockIdx.x;
  const __nv_bfloat16* x = logits + n * V;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ld(x, j));
  mx = detail::block_max(mx, scratch);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += __expf(ld(x, j) - mx);
  s = detail::block_sum(s, scratch);
  if (probs) {
    const float inv = 1.0f / s;
    __nv_bfloat16* p = probs + n * V;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) st(p, j, __expf(ld(x, j) - mx) * inv);
  }
  if (threadIdx.x == 0) {
    const int32_t t = targets[n];
    // Ids were checked on the host; a bad one poisons the loss instead of reading outside.
    losses[n] = (t >= 0 && t < V) ? mx + logf(s) - ld(x, t) : NAN;
  }
}

// One block: thread i sums rows i, i + 1024, ... in double, then a fixed tree; the same
// bits on every run.
__global__ void k_mean(const float* losses, int64_t N, float* out) {
  __shared__ double part[1024];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += double(losses[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = float(part[0] / double(N));
}

__global__ void k_ce_bwd(const __nv_bfloat16* probs, const int32_t* targets, float dloss,
                         __nv_bfloat16* dlogits, bool acc, int64_t V) {
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  const __nv_bfloat16* p = probs + n * V;
  __nv_bfloat16* d = dlogits + n * V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = (ld(p, j) - (j == t ? 1.0f : 0.0f)) * dloss;
    st(d, j, acc ? ld(d, j) + v : v);
  }
}

// Row r holds the scores of query t = r % T over keys [0, T); keys j <= t are valid. As the
// CPU's causal_softmax_row: probabilities over [0, t], zeros above the diagonal.
__global__ void k_causal_softmax_fwd(const float* S, __nv_bfloat16* P, int64_t T) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, n = r % T + 1;
  const float* sr = S + r * T;
  __nv_bfloat16* pr = P + r * T;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, sr[j]);
  mx = detail::block_max(mx, scratch);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += __expf(sr[j] - mx);
  const float inv = 1.0f / detail::block_sum(s, scratch);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
    st(pr, j, j < n ? __expf(sr[j] - mx) * inv : 0.0f);
}

// The same with the row in registers (K values per thread, rows up to K * blockDim.x): the
// scores are read once instead of three times (they are the largest tensor attention
// touches).
template <int K>
__global__ void k_causal_softmax_fwd_regs(const float* S, __nv_bfloat16* P, int64_t T) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, n = r % T + 1;
  const float* sr = S + r * T;
  __nv_bfloat16* pr = P + r * T;
  float v[K];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = threadIdx.x + int64_t(k) * blockDim.x;
    v[k] = j < n ? sr[j] : -INFINITY;
    mx = fmaxf(mx, v[k]);
  }
  mx = detail::block_max(mx, scratch);
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = threadIdx.x + int64_t(k) * blockDim.x;
    v[k] = j < n ? __expf(v[k] - mx) : 0.0f;
    s += v[k];
  }
  const float inv = 1.0f / detail::block_sum(s, scratch);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = threadIdx.x + int64_t(k) * blockDim.x;
    if (j < T) st(pr, j, v[k] * inv);  // v is 0 above the diagonal
  }
}

// dS = P * (dP - sum_{j<=t} dP * P) over the causal part, zeros above (the CPU's in-place
// softmax backward of attention_backward).
__global__ void k_causal_softmax_bwd(const float* dP, const __nv_bfloat16* P, __nv_bfloat16* dS,
                                     int64_t T) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, n = r % T + 1;
  const float* dpr = dP + r * T;
  const __nv_bfloat16* pr = P + r * T;
  __nv_bfloat16* dsr = dS + r * T;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += dpr[j] * ld(pr, j);
  const float dot = detail::block_sum(s, scratch);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
    st(dsr, j, j < n ? ld(pr, j) * (dpr[j] - dot) : 0.0f);
}

void check_rows(int64_t rows, const char* what) {
  WEFT_CHECK(rows <= 0x7fffffffLL, what, ": ", rows, " rows exceed the grid");
}

}  // namespace

void softmax_forward(const bf16* x, bf16* y, int64_t rows, int64_t cols, StreamHandle s) {
  WEFT_CHECK(rows >= 0 && cols > 0, "softmax_forward: bad sizes rows=", rows, " cols=", cols);
  check_rows(rows, "softmax_forward");
  if (rows == 0) return;
  k_softmax_fwd<<<unsigned(rows), kThreads, 0, s>>>(detail::dev(x), detail::dev(y), cols);
  check_launch("softmax_forward");
}

void softmax_backward(const bf16* dy, const bf16* y, bf16* dx, bool accumulate_dx, int64_t rows,
                      int64_t cols, StreamHandle s) {
  WEFT_CHECK(rows >= 0 && cols > 0, "softmax_backward: bad sizes rows=", rows, " cols=", cols);
  check_rows(rows, "softmax_backward");
  if (rows == 0) return;
  k_softmax_bwd<<<unsigned(rows), kThreads, 0, s>>>(detail::dev(dy), detail::dev(y),
                                                    detail::dev(dx), accumulate_dx, cols);
  check_launch("softmax_backward");
}

void cross_entropy_forward(const bf16* logits, const int32_t* targets, float* losses, bf16* probs,
                           float* mean_loss, int64_t N, int64_t V, StreamHandle s) {
  WEFT_CHECK(N > 0 && V > 0, "cross_entropy_forward: bad sizes N=", N, " V=", V);
  WEFT_CHECK(losses != nullptr, "cross_entropy_forward: the per-row losses are needed");
  check_rows(N, "cross_entropy_forward");
  k_ce_fwd<<<unsigned(N), kThreads, 0, s>>>(detail::dev(logits), targets, losses,
                                            probs ? detail::dev(probs) : nullptr, V);
  check_launch("cross_entropy_forward");
  if (mean_loss) {
    k_mean<<<1, 1024, 0, s>>>(losses, N, mean_loss);
    check_launch("cross_entropy_forward (mean)");
  }
}

void cross_entropy_backward(const bf16* probs, const int32_t* targets, float dloss, bf16* dlogits,
                            bool accumulate, int64_t N, int64_t V, StreamHandle s) {
  WEFT_CHECK(N >= 0 && V > 0, "cross_entropy_backward: bad sizes N=", N, " V=", V);
  check_rows(N, "cross_entropy_backward");
  if (N == 0) return;
  k_ce_bwd<<<unsigned(N), kThreads, 0, s>>>(detail::dev(probs), targets, dloss,
                                            detail::dev(dlogits), accumulate, V);
  check_launch("cross_entropy_backward");
}

void causal_softmax_forward(const float* S, bf16* P, int64_t rows, int64_t T, StreamHandle s) {
  WEFT_CHECK(rows >= 0 && T > 0 && rows % T == 0, "causal_softmax_forward: rows=", rows, " T=", T);
  check_rows(rows, "causal_softmax_forward");
  if (rows == 0) return;
  if (T <= 8 * 256)
    k_causal_softmax_fwd_regs<8><<<unsigned(rows), 256, 0, s>>>(S, detail::dev(P), T);
  else
    k_causal_softmax_fwd<<<unsigned(rows), 256, 0, s>>>(S, detail::dev(P), T);
  check_launch("causal_softmax_forward");
}

void causal_softmax_backward(const float* dP, const bf16* P, bf16* dS, int64_t rows, int64_t T,
                             StreamHandle s) {
  WEFT_CHECK(rows >= 0 && T > 0 && rows % T == 0, "causal_softmax_backward: rows=", rows, " T=", T);
  check_rows(rows, "causal_softmax_backward");
  if (rows == 0) return;
  k_causal_softmax_bwd<<<unsigned(rows), 256, 0, s>>>(dP, detail::dev(P), detail::dev(dS), T);
  check_launch("causal_softmax_backward");
}

}  // namespace weft::core::cuda
