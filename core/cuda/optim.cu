// Multi-tensor optimizer kernels: the global gradient norm and AdamW over many parameters
// in a few launches. Tensor descriptors travel in the kernel parameters (as PyTorch's
// multi_tensor_apply does), up to kMaxTensors per launch; block k of a launch works on
// chunk k of the concatenated tensors.
#include <cmath>

#include "core/cuda/common.cuh"

namespace weft::core::cuda {
namespace {

constexpr int kMaxTensors = 32;
constexpr int64_t kChunk = 16384;  // elements per block
constexpr int kThreads = 512;

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

// Which tensor and which chunk of it block `blk` works on.
template <typename Batch>
__device__ void locate(const Batch& a, int64_t blk, int* t, int64_t* chunk) {
  int i = 0;
  while (i + 1 < a.count && a.first_block[i + 1] <= blk) ++i;
  *t = i;
  *chunk = blk - a.first_block[i];
}

struct NormBatch {
  const float* x[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t first_block[kMaxTensors];
  int count;
  int64_t out_offset;  // where this launch's partial sums start in the workspace
};

__global__ void k_sumsq(NormBatch a, double* partial) {
  __shared__ double part[kThreads];
  int t;
  int64_t chunk;
  locate(a, blockIdx.x, &t, &chunk);
  const int64_t i0 = chunk * kChunk, i1 = min(a.n[t], i0 + kChunk);
  double s = 0.0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const double v = a.x[t][i];
    s += v * v;
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[a.out_offset + blockIdx.x] = part[0];
}

// One block adds the partial sums in a fixed order: the same bits on every run.
__global__ void k_norm_final(const double* partial, int64_t n, double* out) {
  __shared__ double part[1024];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = sqrt(part[0]);
}

struct AdamBatch {
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  __nv_bfloat16* pb[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t first_block[kMaxTensors];
  float keep[kMaxTensors];  // 1 - lr * wd for decayed tensors, else 1
  int count;
};

// The CPU's update (core/cpu/adamw.cc) in f32, term for term.
__global__ void k_adamw(AdamBatch a, float lr, float b1, float b2, float eps, float inv_bc1,
                        float inv_bc2, double grad_clip, const double* norm) {
  int t;
  int64_t chunk;
  // A non-finite global norm drops the step (as the CPU's run_adamw): p, m, v untouched.
  if (!isfinite(norm[0])) return;
  locate(a, blockIdx.x, &t, &chunk);
  // Clipping as the reference: scale = min(1, clip / (norm + 1e-6)), in double.
  const float gs = grad_clip > 0 ? float(fmin(1.0, grad_clip / (norm[0] + 1e-6))) : 1.0f;
  const float keep = a.keep[t];
  float* p = a.p[t];
  const float* g = a.g[t];
  float* m = a.m[t];
  float* v = a.v[t];
  __nv_bfloat16* pb = a.pb[t];
  const int64_t i0 = chunk * kChunk, i1 = min(a.n[t], i0 + kChunk);
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const float gi = g[i] * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] * keep - lr * (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
    p[i] = pi;
    if (pb) detail::st(pb, i, pi);
  }
}

}  // namespace

size_t sum_squares_workspace(const std::vector<int64_t>& sizes) {
  int64_t blocks = 0;
  for (int64_t n : sizes) blocks += chunks_of(n);
  return size_t(std::max<int64_t>(1, blocks));
}

void global_norm(const std::vector<const float*>& tensors, const std::vector<int64_t>& sizes,
                 double* out, double* workspace, StreamHandle s) {
  WEFT_CHECK(tensors.size() == sizes.size(), "global_norm: ", tensors.size(), " tensors, ",
             sizes.size(), " sizes");
  int64_t written = 0;
  size_t k = 0;
  while (k < tensors.size()) {
    NormBatch a{};
    int64_t blocks = 0;
    for (; k < tensors.size() && a.count < kMaxTensors; ++k) {
      WEFT_CHECK(sizes[k] >= 0, "global_norm: negative size ", sizes[k]);
      if (sizes[k] == 0) continue;
      a.x[a.count] = tensors[k];
      a.n[a.count] = sizes[k];
      a.first_block[a.count] = blocks;
      blocks += chunks_of(sizes[k]);
      a.count++;
    }
    if (a.count == 0) continue;
    a.out_offset = written;
    k_sumsq<<<unsigned(blocks), kThreads, 0, s>>>(a, workspace);
    check_launch("global_norm (partial sums)");
    written += blocks;
  }
  if (written == 0) {  // no elements at all: the norm is 0
    WEFT_CUDA_DEVICE_CHECK(cudaMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  k_norm_final<<<1, 1024, 0, s>>>(workspace, written, out);
  check_launch("global_norm (final)");
}

void adamw_multi(const std::vector<AdamWTensor>& list, const AdamWHyper& hp, const double* norm,
                 StreamHandle s) {
  WEFT_CHECK(hp.step >= 1, "adamw_multi: step counts from 1, got ", hp.step);
  // Bias corrections in double, then cast, as the CPU.
  const double bc1 = 1.0 - std::pow(hp.beta1, double(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, double(hp.step));
  const float keep_decay = float(1.0 - hp.lr * hp.weight_decay);
  size_t k = 0;
  while (k < list.size()) {
    AdamBatch a{};
    int64_t blocks = 0;
    for (; k < list.size() && a.count < kMaxTensors; ++k) {
      const AdamWTensor& t = list[k];
      WEFT_CHECK(t.n >= 0 && (t.n == 0 || (t.p && t.g && t.m && t.v)), "adamw_multi: tensor ", k,
                 " has n=", t.n, " or a null buffer");
      if (t.n == 0) continue;
      const int i = a.count++;
      a.p[i] = t.p;
      a.g[i] = t.g;
      a.m[i] = t.m;
      a.v[i] = t.v;
      a.pb[i] = t.p_bf16 ? detail::dev(t.p_bf16) : nullptr;
      a.n[i] = t.n;
      a.keep[i] = t.decay ? keep_decay : 1.0f;
      a.first_block[i] = blocks;
      blocks += chunks_of(t.n);
    }
    if (a.count == 0) continue;
    k_adamw<<<unsigned(blocks), kThreads, 0, s>>>(a, float(hp.lr), float(hp.beta1), float(hp.beta2),
                                                  float(hp.eps), float(1.0 / bc1), float(1.0 / bc2),
                                                  hp.grad_clip, norm);
    check_launch("adamw_multi");
  }
}

}  // namespace weft::core::cuda
