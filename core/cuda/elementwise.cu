// Casts, residual add, GELU and the deterministic column sum (bias gradients).
#include "core/cuda/common.cuh"

namespace weft::core::cuda {
namespace {

using detail::ld;
using detail::st;

constexpr int kThreads = 256;

__global__ void k_cast_f32_bf16(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    st(y, i, x[i]);
}
__global__ void k_cast_bf16_f32(const __nv_bfloat16* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = ld(x, i);
}
__global__ void k_add(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    st(y, i, ld(a, i) + ld(b, i));
}
__global__ void k_accumulate(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    st(y, i, ld(y, i) + ld(x, i));
}

// The CPU's constants and exponent cap (core/cpu/activations.cc).
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluCubic = 0.044715f;
__device__ __forceinline__ float gelu_exp(float z) { return __expf(z < 80.0f ? z : 80.0f); }

__global__ void k_gelu_fwd(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t n) {
  const float k2 = 2.0f * kSqrt2OverPi, a = kGeluCubic;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = ld(x, i);
    st(y, i, v / (1.0f + gelu_exp(-k2 * (v + a * v * v * v))));
  }
}
__global__ void k_gelu_bwd(const __nv_bfloat16* dy, const __nv_bfloat16* x, __nv_bfloat16* dx,
                           bool acc, int64_t n) {
  const float k = kSqrt2OverPi, a = kGeluCubic;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = ld(x, i);
    const float e = gelu_exp(-2.0f * k * (v + a * v * v * v));
    const float s = 1.0f / (1.0f + e);
    const float d = s + 2.0f * v * s * (e * s) * k * (1.0f + 3.0f * a * v * v);
    const float g = ld(dy, i) * d;
    st(dx, i, acc ? ld(dx, i) + g : g);
  }
}

// Column sums in two deterministic stages: block (cx, ry) sums rows [ry*R, ry*R + R) of 32
// columns into partial[ry][col]; stage two adds the partials of each column in row-block
// order into out.
constexpr int kColTile = 32, kRowThreads = 8, kRowsPerBlock = 256;
int64_t row_blocks(int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

__global__ void k_colsum_partial(const __nv_bfloat16* x, int64_t rows, int64_t cols,
                                 float* partial) {
  __shared__ float acc[kRowThreads][kColTile];
  const int64_t col = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * int64_t(kRowsPerBlock);
  const int64_t r1 = min(rows, r0 + kRowsPerBlock);
  float s = 0.0f;
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) s += ld(x, r * cols + col);
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float t = 0.0f;
    for (int j = 0; j < kRowThreads; ++j) t += acc[j][threadIdx.x];
    partial[blockIdx.y * cols + col] = t;
  }
}
__global__ void k_colsum_final(const float* partial, int64_t nblocks, int64_t cols, float* out) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < cols;
       c += int64_t(gridDim.x) * blockDim.x) {
    float t = 0.0f;
    for (int64_t b = 0; b < nblocks; ++b) t += partial[b * cols + c];
    out[c] += t;
  }
}

}  // namespace

void cast_f32_to_bf16(const float* x, bf16* y, int64_t n, StreamHandle s) {
  if (n <= 0) return;
  k_cast_f32_bf16<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(x, detail::dev(y), n);
  check_launch("cast_f32_to_bf16");
}
void cast_bf16_to_f32(const bf16* x, float* y, int64_t n, StreamHandle s) {
  if (n <= 0) return;
  k_cast_bf16_f32<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(detail::dev(x), y, n);
  check_launch("cast_bf16_to_f32");
}
void add(const bf16* a, const bf16* b, bf16* y, int64_t n, StreamHandle s) {
  if (n <= 0) return;
  k_add<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(detail::dev(a), detail::dev(b),
                                                           detail::dev(y), n);
  check_launch("add");
}
void accumulate(const bf16* x, bf16* y, int64_t n, StreamHandle s) {
  if (n <= 0) return;
  k_accumulate<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(detail::dev(x), detail::dev(y),
                                                                  n);
  check_launch("accumulate");
}
void gelu_forward(const bf16* x, bf16* y, int64_t n, StreamHandle s) {
  if (n <= 0) return;
  k_gelu_fwd<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(detail::dev(x), detail::dev(y), n);
  check_launch("gelu_forward");
}
void gelu_backward(const bf16* dy, const bf16* x, bf16* dx, bool accumulate_dx, int64_t n,
                   StreamHandle s) {
  if (n <= 0) return;
  k_gelu_bwd<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(detail::dev(dy), detail::dev(x),
                                                                detail::dev(dx), accumulate_dx, n);
  check_launch("gelu_backward");
}

size_t column_sum_workspace(int64_t rows, int64_t cols) {
  return size_t(std::max<int64_t>(1, row_blocks(rows)) * cols);
}
void column_sum(const bf16* x, int64_t rows, int64_t cols, float* out, float* workspace,
                StreamHandle s) {
  WEFT_CHECK(rows >= 0 && cols >= 0, "column_sum: bad sizes rows=", rows, " cols=", cols);
  if (rows == 0 || cols == 0) return;
  const int64_t rb = row_blocks(rows);
  WEFT_CHECK(rb <= 65535, "column_sum: ", rows, " rows exceed the grid");
  dim3 grid(unsigned((cols + kColTile - 1) / kColTile), unsigned(rb));
  k_colsum_partial<<<grid, dim3(kColTile, kRowThreads), 0, s>>>(detail::dev(x), rows, cols,
                                                                workspace);
  check_launch("column_sum (partial)");
  k_colsum_final<<<detail::grid_for(cols, kThreads), kThreads, 0, s>>>(workspace, rb, cols, out);
  check_launch("column_sum (final)");
}

}  // namespace weft::core::cuda
