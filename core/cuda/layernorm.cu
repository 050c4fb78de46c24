// LayerNorm forward and backward: one warp per row for the row statistics and dx; the
// weight and bias gradients are column reductions in two deterministic stages.
#include "core/cuda/common.cuh"

namespace weft::core::cuda {
namespace {

using detail::ld;
using detail::st;

constexpr int kWarps = 8;  // rows per block

__global__ void k_ln_fwd(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* b,
                         __nv_bfloat16* y, float* mean, float* rstd, int64_t N, int64_t C,
                         float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (n >= N) return;
  const __nv_bfloat16* xr = x + n * C;
  // Two passes (mean, then squared deviations), as the CPU, against cancellation.
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += ld(xr, c);
  const float mu = detail::warp_sum(s) / float(C);
  float ss = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = ld(xr, c) - mu;
    ss += d * d;
  }
  const float r = rsqrtf(detail::warp_sum(ss) / float(C) + eps);
  __nv_bfloat16* yr = y + n * C;
  for (int64_t c = lane; c < C; c += 32) st(yr, c, (ld(xr, c) - mu) * r * ld(w, c) + ld(b, c));
  if (lane == 0) {
    mean[n] = mu;
    rstd[n] = r;
  }
}

__global__ void k_ln_bwd_dx(const __nv_bfloat16* dy, const __nv_bfloat16* x, const __nv_bfloat16* w,
                            const float* mean, const float* rstd, __nv_bfloat16* dx, bool acc,
                            int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (n >= N) return;
  const __nv_bfloat16* xr = x + n * C;
  const __nv_bfloat16* dyr = dy + n * C;
  const float m = mean[n], r = rstd[n];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float g = ld(dyr, c) * ld(w, c);
    sg += g;
    sgx += g * ((ld(xr, c) - m) * r);
  }
  const float mg = detail::warp_sum(sg) / float(C), mgx = detail::warp_sum(sgx) / float(C);
  __nv_bfloat16* dxr = dx + n * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = r * (ld(dyr, c) * ld(w, c) - mg - (ld(xr, c) - m) * r * mgx);
    st(dxr, c, acc ? ld(dxr, c) + v : v);
  }
}

// Stage one of dw/db: block (cx, ry) sums rows [ry*R, ry*R + R) for 32 columns.
constexpr int kColTile = 32, kRowThreads = 8, kRowsPerBlock = 256;
int64_t row_blocks(int64_t N) { return (N + kRowsPerBlock - 1) / kRowsPerBlock; }

__global__ void k_ln_bwd_partial(const __nv_bfloat16* dy, const __nv_bfloat16* x, const float* mean,
                                 const float* rstd, int64_t N, int64_t C, float* pw, float* pb) {
  __shared__ float aw[kRowThreads][kColTile], ab[kRowThreads][kColTile];
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * int64_t(kRowsPerBlock), r1 = min(N, r0 + kRowsPerBlock);
  float sw = 0.0f, sb = 0.0f;
  if (c < C)
    for (int64_t n = r0 + threadIdx.y; n < r1; n += kRowThreads) {
      const float d = ld(dy, n * C + c);
      sw += d * ((ld(x, n * C + c) - mean[n]) * rstd[n]);
      sb += d;
    }
  aw[threadIdx.y][threadIdx.x] = sw;
  ab[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int j = 0; j < kRowThreads; ++j) {
      tw += aw[j][threadIdx.x];
      tb += ab[j][threadIdx.x];
    }
    pw[blockIdx.y * C + c] = tw;
    pb[blockIdx.y * C + c] = tb;
  }
}
__global__ void k_ln_bwd_final(const float* pw, const float* pb, int64_t nblocks, int64_t C,
                               float* dw, float* db) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(gridDim.x) * blockDim.x) {
    float tw = 0.0f, tb = 0.0f;
    for (int64_t b = 0; b < nblocks; ++b) {
      tw += pw[b * C + c];
      tb += pb[b * C + c];
    }
    if (dw) dw[c] += tw;
    if (db) db[c] += tb;
  }
}

}  // namespace

void layernorm_forward(const bf16* x, const bf16* w, const bf16* b, bf16* y, float* mean,
                       float* rstd, int64_t N, int64_t C, float eps, StreamHandle s) {
  WEFT_CHECK(N >= 0 && C > 0, "layernorm_forward: bad sizes N=", N, " C=", C);
  if (N == 0) return;
  k_ln_fwd<<<unsigned((N + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(
      detail::dev(x), detail::dev(w), detail::dev(b), detail::dev(y), mean, rstd, N, C, eps);
  check_launch("layernorm_forward");
}

size_t layernorm_backward_workspace(int64_t N, int64_t C) {
  return size_t(2 * std::max<int64_t>(1, row_blocks(N)) * C);
}

void layernorm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* mean,
                        const float* rstd, bf16* dx, bool accumulate_dx, float* dw, float* db,
                        int64_t N, int64_t C, float* workspace, StreamHandle s) {
  WEFT_CHECK(N >= 0 && C > 0, "layernorm_backward: bad sizes N=", N, " C=", C);
  if (N == 0) return;
  if (dx) {
    k_ln_bwd_dx<<<unsigned((N + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(
        detail::dev(dy), detail::dev(x), detail::dev(w), mean, rstd, detail::dev(dx), accumulate_dx,
        N, C);
    check_launch("layernorm_backward (dx)");
  }
  if (!dw && !db) return;
  const int64_t rb = row_blocks(N);
  WEFT_CHECK(rb <= 65535, "layernorm_backward: ", N, " rows exceed the grid");
  float* pw = workspace;
  float* pb = workspace + rb * C;
  dim3 grid(unsigned((C + kColTile - 1) / kColTile), unsigned(rb));
  k_ln_bwd_partial<<<grid, dim3(kColTile, kRowThreads), 0, s>>>(detail::dev(dy), detail::dev(x),
                                                                mean, rstd, N, C, pw, pb);
  check_launch("layernorm_backward (partial)");
  k_ln_bwd_final<<<detail::grid_for(C, 256), 256, 0, s>>>(pw, pb, rb, C, dw, db);
  check_launch("layernorm_backward (final)");
}

}  // namespace weft::core::cuda
