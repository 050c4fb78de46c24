// Fused causal attention, flash-attention style: no (T,T) matrix is ever stored. The
// forward keeps one online softmax per query row and saves its log-sum-exp; the backward
// recomputes the probabilities from it, one kernel for dQ (a thread per query row) and one
// for dK and dV (a thread per key row), so no atomics are needed. The kernels run on CUDA
// cores in f32 (correct first: they could not be run where they were written); a
// tensor-core (mma) version is the next step for speed at T = 1024.
//
// Layout (as the CPU): qkv (B,T,3C), head h of q at column h*hs, of k at C + h*hs, of v
// at 2C + h*hs; out (B,T,C). A thread's own row lives in registers or in shared memory
// padded to hs+1 floats (conflict-free), the rows it loops over in shared tiles that all
// threads read at the same address (broadcast). Scores, softmax and accumulators are f32.
#include <cmath>

#include "core/cuda/common.cuh"

namespace weft::core::cuda {
namespace {

using detail::ld;
using detail::st;

constexpr int kFwdRows = 64;  // query rows per forward block (one thread each)
constexpr int kBwdRows = 32;  // rows per backward block and per tile

// Loads rows [r0, r0 + R) of one head's part `part` (0 q, 1 k, 2 v) into tile[R][HS]
// (zeros past T). All threads of the block take part.
template <int HS, int R>
__device__ void load_tile(const __nv_bfloat16* qkv, int64_t b, int h, int part, int64_t r0,
                          int64_t T, int64_t C, float (*tile)[HS]) {
  for (int e = threadIdx.x; e < R * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS;
    const int64_t t = r0 + r;
    tile[r][d] = t < T ? ld(qkv, (b * T + t) * 3 * C + part * C + int64_t(h) * HS + d) : 0.0f;
  }
}
// Same for a (B,T,C) tensor (out or dout) into tile[R][P] (P = HS or HS + 1).
template <int HS, int R, int P>
__device__ void load_rows(const __nv_bfloat16* x, int64_t b, int h, int64_t r0, int64_t T,
                          int64_t C, float (*tile)[P]) {
  for (int e = threadIdx.x; e < R * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS;
    const int64_t t = r0 + r;
    tile[r][d] = t < T ? ld(x, (b * T + t) * C + int64_t(h) * HS + d) : 0.0f;
  }
}

// grid (ceil(T/64), B*H), block 64: thread = query row t.
template <int HS>
__global__ void k_attn_fwd(const __nv_bfloat16* qkv, __nv_bfloat16* out, float* lse, int64_t T,
                           int64_t C, int H, float scale) {
  __shared__ float Ks[kFwdRows][HS], Vs[kFwdRows][HS];
  const int64_t bh = blockIdx.y, b = bh / H;
  const int h = int(bh % H);
  const int64_t row0 = int64_t(blockIdx.x) * kFwdRows, t = row0 + threadIdx.x;
  const bool valid = t < T;
  float q[HS], o[HS];
  for (int d = 0; d < HS; ++d) {
    q[d] = valid ? ld(qkv, (b * T + t) * 3 * C + int64_t(h) * HS + d) : 0.0f;
    o[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t last =
      min(T - 1, row0 + int64_t(kFwdRows) - 1);  // the block's last row sees keys <= last
  for (int64_t j0 = 0; j0 <= last; j0 += kFwdRows) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<HS, kFwdRows>(qkv, b, h, 1, j0, T, C, Ks);
    load_tile<HS, kFwdRows>(qkv, b, h, 2, j0, T, C, Vs);
    __syncthreads();
    if (!valid) continue;
    const int jn = int(min(int64_t(kFwdRows), t - j0 + 1));  // causal: keys j <= t
    for (int j = 0; j < jn; ++j) {
      float s = 0.0f;
#pragma unroll
      for (int d = 0; d < HS; ++d) s += q[d] * Ks[j][d];
      s *= scale;
      if (s > m) {  // new maximum: rescale what was accumulated
        const float corr = __expf(m - s);
        l = l * corr + 1.0f;
#pragma unroll
        for (int d = 0; d < HS; ++d) o[d] = o[d] * corr + Vs[j][d];
        m = s;
      } else {
        const float p = __expf(s - m);
        l += p;
#pragma unroll
        for (int d = 0; d < HS; ++d) o[d] += p * Vs[j][d];
      }
    }
  }
  if (!valid) return;
  const float inv = 1.0f / l;
  for (int d = 0; d < HS; ++d) st(out, (b * T + t) * C + int64_t(h) * HS + d, o[d] * inv);
  lse[bh * T + t] = m + logf(l);
}

// dQ: grid (ceil(T/32), B*H), block 32: thread = query row i. q in registers, dout in
// padded shared memory. Two passes over the keys: the first computes the softmax
// backward's row dot D_i = sum_j P_ij (dout_i . v_j) exactly as the CPU does (from the
// probabilities, not from the rounded output) and stores it for k_attn_dkv; the second
// accumulates dq_i = scale * sum_{j<=i} P_ij (dout_i . v_j - D_i) k_j.
template <int HS>
__global__ void k_attn_dq(const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const float* lse,
                          float* D, __nv_bfloat16* dqkv, bool acc, int64_t T, int64_t C, int H,
                          float scale) {
  __shared__ float dOs[kBwdRows][HS + 1];
  __shared__ float Ks[kBwdRows][HS], Vs[kBwdRows][HS];
  const int64_t bh = blockIdx.y, b = bh / H;
  const int h = int(bh % H);
  const int64_t row0 = int64_t(blockIdx.x) * kBwdRows, i = row0 + threadIdx.x;
  const bool valid = i < T;
  load_rows<HS, kBwdRows, HS + 1>(dout, b, h, row0, T, C, dOs);
  float q[HS], dq[HS];
  for (int d = 0; d < HS; ++d) {
    q[d] = valid ? ld(qkv, (b * T + i) * 3 * C + int64_t(h) * HS + d) : 0.0f;
    dq[d] = 0.0f;
  }
  const float li = valid ? lse[bh * T + i] : 0.0f;
  const int64_t last = min(T - 1, row0 + int64_t(kBwdRows) - 1);
  float Di = 0.0f;
  for (int64_t j0 = 0; j0 <= last; j0 += kBwdRows) {
    __syncthreads();
    load_tile<HS, kBwdRows>(qkv, b, h, 1, j0, T, C, Ks);
    load_tile<HS, kBwdRows>(qkv, b, h, 2, j0, T, C, Vs);
    __syncthreads();
    if (!valid) continue;
    const int jn = int(min(int64_t(kBwdRows), i - j0 + 1));
    for (int j = 0; j < jn; ++j) {
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int d = 0; d < HS; ++d) {
        s += q[d] * Ks[j][d];
        dp += dOs[threadIdx.x][d] * Vs[j][d];
      }
      Di += __expf(s * scale - li) * dp;
    }
  }
  if (valid) D[bh * T + i] = Di;
  for (int64_t j0 = 0; j0 <= last; j0 += kBwdRows) {
    __syncthreads();
    load_tile<HS, kBwdRows>(qkv, b, h, 1, j0, T, C, Ks);
    load_tile<HS, kBwdRows>(qkv, b, h, 2, j0, T, C, Vs);
    __syncthreads();
    if (!valid) continue;
    const int jn = int(min(int64_t(kBwdRows), i - j0 + 1));
    for (int j = 0; j < jn; ++j) {
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int d = 0; d < HS; ++d) {
        s += q[d] * Ks[j][d];
        dp += dOs[threadIdx.x][d] * Vs[j][d];
      }
      const float p = __expf(s * scale - li);
      const float ds = p * (dp - Di) * scale;
#pragma unroll
      for (int d = 0; d < HS; ++d) dq[d] += ds * Ks[j][d];
    }
  }
  if (!valid) return;
  __nv_bfloat16* dst = dqkv + (b * T + i) * 3 * C + int64_t(h) * HS;
  for (int d = 0; d < HS; ++d) st(dst, d, acc ? ld(dst, d) + dq[d] : dq[d]);
}

// dK, dV: grid (ceil(T/32), B*H), block 32: thread = key row j, over query rows i >= j.
// dv_j = sum_i P_ij dout_i; dk_j = scale * sum_i P_ij (dout_i . v_j - D_i) q_i.
template <int HS>
__global__ void k_attn_dkv(const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const float* lse,
                           const float* D, __nv_bfloat16* dqkv, bool acc, int64_t T, int64_t C,
                           int H, float scale) {
  __shared__ float Kown[kBwdRows][HS + 1], Vown[kBwdRows][HS + 1];
  __shared__ float Qs[kBwdRows][HS], dOs[kBwdRows][HS];
  __shared__ float Ls[kBwdRows], Ds[kBwdRows];
  const int64_t bh = blockIdx.y, b = bh / H;
  const int h = int(bh % H);
  const int64_t row0 = int64_t(blockIdx.x) * kBwdRows, j = row0 + threadIdx.x;
  const bool valid = j < T;
  for (int e = threadIdx.x; e < kBwdRows * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS;
    const int64_t t = row0 + r;
    const int64_t base = (b * T + t) * 3 * C + int64_t(h) * HS + d;
    Kown[r][d] = t < T ? ld(qkv, base + C) : 0.0f;
    Vown[r][d] = t < T ? ld(qkv, base + 2 * C) : 0.0f;
  }
  float dk[HS], dv[HS];
  for (int d = 0; d < HS; ++d) dk[d] = dv[d] = 0.0f;
  for (int64_t i0 = row0; i0 < T; i0 += kBwdRows) {  // query tiles that can see this block
    __syncthreads();
    load_tile<HS, kBwdRows>(qkv, b, h, 0, i0, T, C, Qs);
    load_rows<HS, kBwdRows, HS>(dout, b, h, i0, T, C, dOs);
    if (threadIdx.x < kBwdRows) {
      const int64_t t = i0 + threadIdx.x;
      Ls[threadIdx.x] = t < T ? lse[bh * T + t] : 0.0f;
      Ds[threadIdx.x] = t < T ? D[bh * T + t] : 0.0f;
    }
    __syncthreads();
    if (!valid) continue;
    for (int r = 0; r < kBwdRows; ++r) {
      const int64_t i = i0 + r;
      if (i < j || i >= T) continue;  // causal: query i sees key j only when j <= i
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int d = 0; d < HS; ++d) {
        s += Qs[r][d] * Kown[threadIdx.x][d];
        dp += dOs[r][d] * Vown[threadIdx.x][d];
      }
      const float p = __expf(s * scale - Ls[r]);
      const float ds = p * (dp - Ds[r]) * scale;
#pragma unroll
      for (int d = 0; d < HS; ++d) {
        dv[d] += p * dOs[r][d];
        dk[d] += ds * Qs[r][d];
      }
    }
  }
  if (!valid) return;
  __nv_bfloat16* dst = dqkv + (b * T + j) * 3 * C + int64_t(h) * HS;
  for (int d = 0; d < HS; ++d) {
    st(dst, C + d, acc ? ld(dst, C + d) + dk[d] : dk[d]);
    st(dst, 2 * C + d, acc ? ld(dst, 2 * C + d) + dv[d] : dv[d]);
  }
}

void check_args(int64_t B, int64_t T, int64_t C, int64_t H) {
  WEFT_CHECK(B >= 0 && T >= 0 && C > 0 && H > 0, "attention: bad sizes B=", B, " T=", T, " C=", C,
             " H=", H);
  WEFT_CHECK(C % H == 0, "attention: C=", C, " is not divisible by H=", H);
  WEFT_ENSURE(attention_supported(C, H), NotSupported, "CUDA attention: head size ", C / H,
              " is not one of 16, 32, 64");
  WEFT_CHECK(B * H <= 65535 && (T + kBwdRows - 1) / kBwdRows <= 0x7fffffffLL,
             "attention: B*H=", B * H, " exceeds the grid");
}

// Calls f.template operator()<HS>() for the head size.
template <typename F>
void dispatch_hs(int64_t hs, F&& f) {
  switch (hs) {
    case 16:
      f.template operator()<16>();
      break;
    case 32:
      f.template operator()<32>();
      break;
    case 64:
      f.template operator()<64>();
      break;
    default:
      throw NotSupported(str("CUDA attention: head size ", hs));
  }
}

}  // namespace

bool attention_supported(int64_t C, int64_t H) {
  if (H <= 0 || C % H != 0) return false;
  const int64_t hs = C / H;
  return hs == 16 || hs == 32 || hs == 64;
}

void attention_forward(const bf16* qkv, bf16* out, float* lse, int64_t B, int64_t T, int64_t C,
                       int64_t H, StreamHandle s) {
  check_args(B, T, C, H);
  if (B * T == 0) return;
  const float scale = float(1.0 / std::sqrt(double(C / H)));  // as the CPU: 1/sqrt(hs)
  dim3 grid(unsigned((T + kFwdRows - 1) / kFwdRows), unsigned(B * H));
  dispatch_hs(C / H, [&]<int HS>() {
    k_attn_fwd<HS>
        <<<grid, kFwdRows, 0, s>>>(detail::dev(qkv), detail::dev(out), lse, T, C, int(H), scale);
  });
  check_launch("attention_forward");
}

size_t attention_backward_workspace(int64_t B, int64_t T, int64_t H) {
  return size_t(std::max<int64_t>(1, B * H * T));
}

void attention_backward(const bf16* dout, const bf16* qkv, const float* lse, bf16* dqkv,
                        bool accumulate_dqkv, float* workspace, int64_t B, int64_t T, int64_t C,
                        int64_t H, StreamHandle s) {
  check_args(B, T, C, H);
  if (B * T == 0) return;
  const float scale = float(1.0 / std::sqrt(double(C / H)));
  float* D = workspace;  // (B,H,T): written by k_attn_dq, read by k_attn_dkv
  dim3 grid(unsigned((T + kBwdRows - 1) / kBwdRows), unsigned(B * H));
  dispatch_hs(C / H, [&]<int HS>() {
    k_attn_dq<HS><<<grid, kBwdRows, 0, s>>>(detail::dev(dout), detail::dev(qkv), lse, D,
                                            detail::dev(dqkv), accumulate_dqkv, T, C, int(H),
                                            scale);
    check_launch("attention_backward (dq)");
    k_attn_dkv<HS><<<grid, kBwdRows, 0, s>>>(detail::dev(dout), detail::dev(qkv), lse, D,
                                             detail::dev(dqkv), accumulate_dqkv, T, C, int(H),
                                             scale);
    check_launch("attention_backward (dk, dv)");
  });
}

}  // namespace weft::core::cuda
