// The element-wise and row kernels of the Llama block: RMSNorm, rotary embedding
// (rotate-half) and the SiLU-gated product, the device twins of core/cpu/rmsnorm.cc,
// rope.cc and swiglu.cc. Each is one template over the storage type (bf16 or f32); the
// arithmetic is f32 either way, so the f32 instantiation checks the formulas tightly
// against the CPU and the bf16 one is what mixed-precision training runs.
#include <cmath>

#include "core/cuda/common.cuh"

namespace weft::core::cuda {
namespace {

using detail::dev;

inline const float* dev(const float* p) { return p; }
inline float* dev(float* p) { return p; }

__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return detail::ld(p, i);
}
__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { detail::st(p, i, v); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }

constexpr int kWarps = 8;      // RMSNorm rows per block (one warp each)
constexpr int kThreads = 256;  // element-wise blocks

// ---- RMSNorm --------------------------------------------------------------------------

// y = (x * rstd) * w, the CPU's order; the sum of squares is f32 (the CPU's is double).
template <typename S>
__global__ void k_rms_fwd(const S* x, const S* w, S* y, float* rstd, int64_t N, int64_t C,
                          float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (n >= N) return;
  const S* xr = x + n * C;
  float ss = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = load(xr, c);
    ss += v * v;
  }
  const float r = 1.0f / sqrtf(detail::warp_sum(ss) / float(C) + eps);
  S* yr = y + n * C;
  for (int64_t c = lane; c < C; c += 32) store(yr, c, load(xr, c) * r * load(w, c));
  if (lane == 0) rstd[n] = r;
}

// dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * rstd.
template <typename S>
__global__ void k_rms_bwd_dx(const S* dy, const S* x, const S* w, const float* rstd, S* dx,
                             bool acc, int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (n >= N) return;
  const S* xr = x + n * C;
  const S* dyr = dy + n * C;
  const float r = rstd[n];
  float sgx = 0.0f;
  for (int64_t c = lane; c < C; c += 32) sgx += (load(dyr, c) * load(w, c)) * (load(xr, c) * r);
  const float mgx = detail::warp_sum(sgx) / float(C);
  S* dxr = dx + n * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = r * (load(dyr, c) * load(w, c) - load(xr, c) * r * mgx);
    store(dxr, c, acc ? load(dxr, c) + v : v);
  }
}

// dw in two deterministic stages, as LayerNorm's: block (cx, ry) sums rows
// [ry*R, ry*R + R) of 32 columns into pw (row blocks, C); the final pass sums the blocks.
constexpr int kColTile = 32, kRowThreads = 8, kRowsPerBlock = 256;
int64_t row_blocks(int64_t N) { return (N + kRowsPerBlock - 1) / kRowsPerBlock; }

template <typename S>
__global__ void k_rms_bwd_partial(const S* dy, const S* x, const float* rstd, int64_t N, int64_t C,
                                  float* pw) {
  __shared__ float aw[kRowThreads][kColTile];
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * int64_t(kRowsPerBlock), r1 = min(N, r0 + kRowsPerBlock);
  float sw = 0.0f;
  if (c < C)
    for (int64_t n = r0 + threadIdx.y; n < r1; n += kRowThreads)
      sw += load(dy, n * C + c) * (load(x, n * C + c) * rstd[n]);
  aw[threadIdx.y][threadIdx.x] = sw;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.0f;
    for (int j = 0; j < kRowThreads; ++j) tw += aw[j][threadIdx.x];
    pw[blockIdx.y * C + c] = tw;
  }
}
__global__ void k_rms_bwd_final(const float* pw, int64_t nblocks, int64_t C, float* dw) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(gridDim.x) * blockDim.x) {
    float tw = 0.0f;
    for (int64_t b = 0; b < nblocks; ++b) tw += pw[b * C + c];
    dw[c] += tw;
  }
}

template <typename S>
void rms_forward(const S* x, const S* w, S* y, float* rstd, int64_t N, int64_t C, float eps,
                 StreamHandle s) {
  WEFT_CHECK(N >= 0 && C > 0, "rmsnorm_forward: bad sizes N=", N, " C=", C);
  if (N == 0) return;
  k_rms_fwd<<<unsigned((N + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(dev(x), dev(w), dev(y),
                                                                        rstd, N, C, eps);
  check_launch("rmsnorm_forward");
}

template <typename S>
void rms_backward(const S* dy, const S* x, const S* w, const float* rstd, S* dx, bool accumulate_dx,
                  float* dw, int64_t N, int64_t C, float* workspace, StreamHandle s) {
  WEFT_CHECK(N >= 0 && C > 0, "rmsnorm_backward: bad sizes N=", N, " C=", C);
  if (N == 0) return;
  if (dx) {
    k_rms_bwd_dx<<<unsigned((N + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(
        dev(dy), dev(x), dev(w), rstd, dev(dx), accumulate_dx, N, C);
    check_launch("rmsnorm_backward (dx)");
  }
  if (!dw) return;
  const int64_t rb = row_blocks(N);
  WEFT_CHECK(rb <= 65535, "rmsnorm_backward: ", N, " rows exceed the grid");
  dim3 grid(unsigned((C + kColTile - 1) / kColTile), unsigned(rb));
  k_rms_bwd_partial<<<grid, dim3(kColTile, kRowThreads), 0, s>>>(dev(dy), dev(x), rstd, N, C,
                                                                 workspace);
  check_launch("rmsnorm_backward (partial)");
  k_rms_bwd_final<<<detail::grid_for(C, 256), 256, 0, s>>>(workspace, rb, C, dw);
  check_launch("rmsnorm_backward (final)");
}

// ---- Rotary embedding ---------------------------------------------------------------

// One thread per pair (row, head, j): the angle t * theta^(-2j/hs) and its cos and sin
// in double, rounded to f32 as the CPU's table; sign -1 rotates back (backward). Each
// pair is read before it is written, so y may equal x when not accumulating.
template <typename S>
__global__ void k_rope(const S* x, S* y, bool acc, int64_t pairs, int64_t T, int64_t heads,
                       int64_t hs, double theta, float sign) {
  const int64_t half = hs / 2;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pairs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % half, rest = i / half, h = rest % heads, row = rest / heads;
    const int64_t t = row % T;
    const double inv_freq = 1.0 / pow(theta, double(2 * j) / double(hs));
    double sn_d, cs_d;
    sincos(double(t) * inv_freq, &sn_d, &cs_d);
    const float cs = float(cs_d), sn = sign * float(sn_d);
    const int64_t a = row * heads * hs + h * hs + j, b = a + half;
    const float x1 = load(x, a), x2 = load(x, b);
    float y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
    if (acc) {
      y1 += load(y, a);
      y2 += load(y, b);
    }
    store(y, a, y1);
    store(y, b, y2);
  }
}

template <typename S>
void rope_rotate(const S* x, S* y, bool acc, int64_t B, int64_t T, int64_t heads, int64_t hs,
                 double theta, float sign, const char* what, StreamHandle s) {
  WEFT_CHECK(B >= 0 && T >= 0 && heads > 0 && hs > 0, what, ": bad sizes B=", B, " T=", T,
             " heads=", heads, " hs=", hs);
  WEFT_CHECK(hs % 2 == 0, what, ": head size ", hs, " must be even to pair its halves");
  WEFT_CHECK(theta > 0, what, ": theta must be positive, got ", theta);
  const int64_t pairs = B * T * heads * (hs / 2);
  if (pairs == 0) return;
  k_rope<<<detail::grid_for(pairs, kThreads), kThreads, 0, s>>>(dev(x), dev(y), acc, pairs, T,
                                                                heads, hs, theta, sign);
  check_launch(what);
}

// ---- SiLU-gated product ---------------------------------------------------------------

// e^(-g) with the exponent capped at 80, as the CPU (no inf * 0, no subnormal sigmoid).
__device__ __forceinline__ float exp_neg(float g) { return expf(fminf(-g, 80.0f)); }

template <typename S>
__global__ void k_swiglu_fwd(const S* gate, const S* up, S* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load(gate, i);
    store(out, i, g / (1.0f + exp_neg(g)) * load(up, i));
  }
}

// silu'(g) = s + g s (1 - s) with 1 - s = e s, as the CPU.
template <typename S>
__global__ void k_swiglu_bwd(const S* dout, const S* gate, const S* up, S* dgate, S* dup, bool acc,
                             int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load(gate, i), e = exp_neg(g), s = 1.0f / (1.0f + e), d = load(dout, i);
    const float dg = d * load(up, i) * (s + g * s * (e * s)), du = d * (g * s);
    store(dgate, i, acc ? load(dgate, i) + dg : dg);
    store(dup, i, acc ? load(dup, i) + du : du);
  }
}

template <typename S>
void swiglu_fwd(const S* gate, const S* up, S* out, int64_t n, StreamHandle s) {
  WEFT_CHECK(n >= 0, "swiglu_forward: bad size n=", n);
  if (n == 0) return;
  k_swiglu_fwd<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(dev(gate), dev(up), dev(out), n);
  check_launch("swiglu_forward");
}

template <typename S>
void swiglu_bwd(const S* dout, const S* gate, const S* up, S* dgate, S* dup, bool acc, int64_t n,
                StreamHandle s) {
  WEFT_CHECK(n >= 0, "swiglu_backward: bad size n=", n);
  if (n == 0) return;
  k_swiglu_bwd<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(dev(dout), dev(gate), dev(up),
                                                                  dev(dgate), dev(dup), acc, n);
  check_launch("swiglu_backward");
}

}  // namespace

size_t rmsnorm_backward_workspace(int64_t N, int64_t C) {
  return size_t(std::max<int64_t>(1, row_blocks(N)) * C);
}

#define WEFT_LLAMA_KERNELS(S)                                                                      \
  void rmsnorm_forward(const S* x, const S* w, S* y, float* rstd, int64_t N, int64_t C, float eps, \
                       StreamHandle s) {                                                           \
    rms_forward(x, w, y, rstd, N, C, eps, s);                                                      \
  }                                                                                                \
  void rmsnorm_backward(const S* dy, const S* x, const S* w, const float* rstd, S* dx,             \
                        bool accumulate_dx, float* dw, int64_t N, int64_t C, float* workspace,     \
                        StreamHandle s) {                                                          \
    rms_backward(dy, x, w, rstd, dx, accumulate_dx, dw, N, C, workspace, s);                       \
  }                                                                                                \
  void rope_forward(const S* x, S* y, int64_t B, int64_t T, int64_t heads, int64_t hs,             \
                    double theta, StreamHandle s) {                                                \
    rope_rotate(x, y, false, B, T, heads, hs, theta, 1.0f, "rope_forward", s);                     \
  }                                                                                                \
  void rope_backward(const S* dy, S* dx, bool accumulate_dx, int64_t B, int64_t T, int64_t heads,  \
                     int64_t hs, double theta, StreamHandle s) {                                   \
    WEFT_CHECK(!(accumulate_dx && dx == dy), "rope_backward: cannot accumulate in place");         \
    rope_rotate(dy, dx, accumulate_dx, B, T, heads, hs, theta, -1.0f, "rope_backward", s);         \
  }                                                                                                \
  void swiglu_forward(const S* gate, const S* up, S* out, int64_t n, StreamHandle s) {             \
    swiglu_fwd(gate, up, out, n, s);                                                               \
  }                                                                                                \
  void swiglu_backward(const S* dout, const S* gate, const S* up, S* dgate, S* dup,                \
                       bool accumulate, int64_t n, StreamHandle s) {                               \
    swiglu_bwd(dout, gate, up, dgate, dup, accumulate, n, s);                                      \
  }

WEFT_LLAMA_KERNELS(bf16)
WEFT_LLAMA_KERNELS(float)
#undef WEFT_LLAMA_KERNELS

}  // namespace weft::core::cuda
