// Shared helpers of the CUDA tests: the skip when no GPU is present, a small device
// arena with a stream, random bf16-exact inputs, and copies in and out.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "core/cuda/arena.h"
#include "core/cuda/gemm.h"
#include "core/cuda/runtime.h"
#include "core/cuda/transfer.h"
#include "core/tensor.h"

namespace weft::core::cuda::testing {

#define WEFT_REQUIRE_GPU()                                                          \
  do {                                                                              \
    if (::weft::core::cuda::device_count() == 0)                                    \
      GTEST_SKIP() << "no CUDA device: " << ::weft::core::cuda::no_device_reason(); \
  } while (0)

// Values exactly representable in bf16, so the CPU reference and the GPU see the same
// inputs and only the arithmetic differs.
inline std::vector<float> random_bf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_float(float_to_bf16(dist(gen)));
  return v;
}
inline std::vector<int32_t> random_ids(size_t n, int32_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// One arena (512 MiB), a caching allocator over it, a stream and a cuBLASLt handle.
class Gpu {
 public:
  Gpu() : arena_(512u << 20), alloc_(memory::CachingOptions{}, &arena_.source()) {}
  // A device tensor of `dtype` holding `v` (converted on the host).
  template <typename T>
  Tensor put(const Shape& shape, const std::vector<T>& v, DType dtype) {
    return to_device(Tensor::from_vector(shape, v), dtype, Device::cuda(0), alloc_, stream());
  }
  Tensor zeros(const Shape& shape, DType dtype) {
    Tensor t = Tensor::empty_on(Device::cuda(0), shape, dtype, alloc_);
    zero_device(t, stream());
    return t;
  }
  // Host copy as f32 (or as it is for integers / f64).
  std::vector<float> get(const Tensor& t) {
    return to_host(t, DType::kF32, stream()).to_vector<float>();
  }
  StreamHandle stream() const { return stream_.get(); }
  BlasLt& blas() { return blas_; }
  memory::Allocator& alloc() { return alloc_; }

 private:
  DeviceArena arena_;
  memory::CachingAllocator alloc_;
  Stream stream_;
  BlasLt blas_;
};

// max |a - b| / (atol + rtol * |b|) <= 1 elementwise; reports the worst element.
inline ::testing::AssertionResult close(const std::vector<float>& got,
                                        const std::vector<float>& want, double rtol, double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    double e = diff == 0 ? 0.0 : diff / (atol + rtol * std::fabs(want[i]));
    if (!(e <= worst)) {  // also catches NaN
      worst = std::isnan(e) ? INFINITY : e;
      at = i;
    }
  }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": got " << got[at] << ", want "
                                       << want[at] << " (error ratio " << worst << ")";
}

// Rounds to bf16 and back (what a bf16 output of the same value would hold).
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

}  // namespace weft::core::cuda::testing
