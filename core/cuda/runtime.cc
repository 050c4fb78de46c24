// Device queries, streams and events over the CUDA runtime.
#include "core/cuda/runtime.h"

#include <cuda_runtime.h>

#include "base/check.h"
#include "base/foreign_checks.h"

namespace weft::core::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (rc != cudaSuccess) return cudaGetErrorString(rc);
  return n == 0 ? "no CUDA device is visible" : "";
}

void require_device(const std::string& field) {
  if (device_count() > 0) return;
  throw ConfigError(field, "'cuda' needs a GPU, but " + no_device_reason() +
                               " (check CUDA_VISIBLE_DEVICES and the driver), or set " + field +
                               ": cpu");
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  WEFT_CUDA_DEVICE_CHECK(cudaGetDeviceProperties(&p, device));
  return str(p.name, ", ", double(p.totalGlobalMem) / double(1ull << 30), " GiB, sm_", p.major,
             p.minor);
}

void set_device(int device) { WEFT_CUDA_DEVICE_CHECK(cudaSetDevice(device)); }

Stream::Stream() { WEFT_CUDA_DEVICE_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);  // destructors never throw
}
void Stream::synchronize() const { WEFT_CUDA_DEVICE_CHECK(cudaStreamSynchronize(s_)); }

Event::Event() { WEFT_CUDA_DEVICE_CHECK(cudaEventCreate(&e_)); }
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
void Event::record(StreamHandle s) { WEFT_CUDA_DEVICE_CHECK(cudaEventRecord(e_, s)); }
void Event::synchronize() const { WEFT_CUDA_DEVICE_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  WEFT_CUDA_DEVICE_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

void check_launch(const char* what) {
  cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    detail::raise_foreign({detail::FailureKind::kDevice}, "CUDA", what, __FILE__,
                                __LINE__, cudaGetErrorString(rc));
}

}  // namespace weft::core::cuda
