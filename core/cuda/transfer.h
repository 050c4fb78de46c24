// Moving tensors between the host and a CUDA device, converting the element type on the
// host side (bf16 <-> f32 widening is exact; narrowing rounds to nearest even).
#pragma once

#include "core/cuda/runtime.h"
#include "core/tensor.h"
#include "memory/allocator.h"

namespace weft::core::cuda {

// A contiguous host copy of device tensor `dev`, converted to `dtype`. Synchronises `s`
// (so everything issued before on it is done). Throws weft::Error on a CUDA failure.
Tensor to_host(const Tensor& dev, DType dtype, StreamHandle s);
inline Tensor to_host(const Tensor& dev, StreamHandle s) { return to_host(dev, dev.dtype(), s); }

// Copies host tensor `host` (any dtype, same shape) into the contiguous device tensor
// `dev`, converting to dev's dtype, and synchronises `s` so `host` may die at once.
void upload(const Tensor& host, Tensor& dev, StreamHandle s);

// A new device tensor with host's contents converted to `dtype`, bytes from `alloc`.
Tensor to_device(const Tensor& host, DType dtype, Device device, memory::Allocator& alloc,
                 StreamHandle s, memory::Tag tag = memory::Tag::kOther);

// Device-to-device copy of same-shape, same-dtype contiguous tensors (asynchronous).
void copy_device(const Tensor& src, Tensor& dst, StreamHandle s);
// Zeroes a contiguous device tensor (asynchronous).
void zero_device(Tensor& t, StreamHandle s);

}  // namespace weft::core::cuda
