// Device-side helpers shared by the .cu files: bf16 loads and stores through f32, warp and
// block reductions, grid sizing. Internal to core/cuda/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "base/check.h"
#include "base/foreign_checks.h"
#include "core/cuda/kernels.h"

namespace weft::core::cuda::detail {

// core::bf16 and __nv_bfloat16 are both the top half of an IEEE float.
static_assert(sizeof(core::bf16) == sizeof(__nv_bfloat16));
inline const __nv_bfloat16* dev(const core::bf16* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
inline __nv_bfloat16* dev(core::bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
// Round to nearest even, as core::float_to_bf16 does.
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread
// gets the result. `scratch` is 32 floats of shared memory; the function syncs before it
// returns, so the same scratch may be reused at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous use of scratch is finished
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : -INFINITY;
  t = warp_max(t);
  __syncthreads();
  return t;
}

// Blocks for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 32) b = 65535LL * 32;  // grid-stride loops cover the rest
  return unsigned(b);
}

}  // namespace weft::core::cuda::detail
