// Host <-> device copies through cudaMemcpyAsync, conversions on the host.
#include "core/cuda/transfer.h"

#include <cuda_runtime.h>

#include "base/check.h"
#include "base/foreign_checks.h"

namespace weft::core::cuda {

static void check_device_tensor(const Tensor& t, const char* what) {
  WEFT_CHECK(t.defined() && !t.device().is_cpu() && t.is_contiguous(), what,
             ": needs a contiguous CUDA tensor, got one on ", t.device().to_string());
}

Tensor to_host(const Tensor& dev, DType dtype, StreamHandle s) {
  check_device_tensor(dev, "to_host");
  Tensor raw = Tensor::empty(dev.shape(), dev.dtype());
  if (dev.nbytes() > 0) {
    WEFT_CUDA_DEVICE_CHECK(
        cudaMemcpyAsync(raw.raw_data(), dev.raw_data(), dev.nbytes(), cudaMemcpyDeviceToHost, s));
  }
  WEFT_CUDA_DEVICE_CHECK(cudaStreamSynchronize(s));
  return dtype == dev.dtype() ? raw : raw.to(dtype);
}

void upload(const Tensor& host, Tensor& dev, StreamHandle s) {
  check_device_tensor(dev, "upload");
  WEFT_CHECK(host.device().is_cpu() && host.shape() == dev.shape(), "upload: shape ",
             shape_str(host.shape()), " into ", shape_str(dev.shape()));
  Tensor src = host.dtype() == dev.dtype() ? host.contiguous() : host.to(dev.dtype());
  if (dev.nbytes() > 0) {
    WEFT_CUDA_DEVICE_CHECK(
        cudaMemcpyAsync(dev.raw_data(), src.raw_data(), dev.nbytes(), cudaMemcpyHostToDevice, s));
  }
  WEFT_CUDA_DEVICE_CHECK(cudaStreamSynchronize(s));  // `src` may be a temporary
}

Tensor to_device(const Tensor& host, DType dtype, Device device, memory::Allocator& alloc,
                 StreamHandle s, memory::Tag tag) {
  Tensor dev = Tensor::empty_on(device, host.shape(), dtype, alloc, tag);
  upload(host, dev, s);
  return dev;
}

void copy_device(const Tensor& src, Tensor& dst, StreamHandle s) {
  check_device_tensor(src, "copy_device");
  check_device_tensor(dst, "copy_device");
  WEFT_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(),
             "copy_device: ", shape_str(src.shape()), " ", dtype_name(src.dtype()), " into ",
             shape_str(dst.shape()), " ", dtype_name(dst.dtype()));
  if (src.nbytes() == 0 || src.raw_data() == dst.raw_data()) return;
  WEFT_CUDA_DEVICE_CHECK(
      cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToDevice, s));
}

void zero_device(Tensor& t, StreamHandle s) {
  check_device_tensor(t, "zero_device");
  if (t.nbytes() > 0) WEFT_CUDA_DEVICE_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), s));
}

}  // namespace weft::core::cuda
