// Tensor: a shape and strides over reference-counted storage obtained from a
// memory::Allocator. Views share storage; copies are explicit (clone, contiguous).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "core/device.h"
#include "core/dtype.h"
#include "memory/allocator.h"

namespace weft::core {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// Owns one block from an allocator and returns it when the last tensor lets go.
class Storage {
 public:
  Storage(size_t bytes, Device device, memory::Allocator& alloc, memory::Tag tag);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  memory::Allocator* alloc_;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor: defined() is false

  // New contiguous tensor, uninitialised. `alloc` defaults to the host allocator.
  static Tensor empty(const Shape& shape, DType dtype, memory::Allocator* alloc = nullptr,
                      memory::Tag tag = memory::Tag::kOther);
  static Tensor zeros(const Shape& shape, DType dtype, memory::Allocator* alloc = nullptr,
                      memory::Tag tag = memory::Tag::kOther);
  // New contiguous tensor on `device`, uninitialised, its bytes from `alloc` (which must
  // serve memory of that device: core/cuda/ gives a device arena's allocator). Element
  // access, copies and fills below are host-only and refuse non-CPU tensors; device code
  // (core/cuda/) reads raw_data() and moves bytes itself.
  static Tensor empty_on(Device device, const Shape& shape, DType dtype, memory::Allocator& alloc,
                         memory::Tag tag = memory::Tag::kOther);
  template <typename T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(d < 0 ? d + dim() : d); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  // Typed pointer to the first element; checks the dtype.
  template <typename T>
  T* data() const {
    WEFT_CHECK(dtype_of<T>() == dtype_, "tensor is ", dtype_name(dtype_), ", asked for ",
               dtype_name(dtype_of<T>()));
    return reinterpret_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // Views (share storage).
  Tensor view(const Shape& shape) const;                          // contiguous only
  Tensor slice(int64_t dim, int64_t start, int64_t length) const;  // narrow one dim
  Tensor select(int64_t dim, int64_t index) const;                // drop one dim

  // Copies.
  Tensor clone(memory::Allocator* alloc = nullptr) const;  // contiguous copy
  Tensor contiguous() const;                               // self when already contiguous
  Tensor to(DType dtype) const;                            // converting copy
  void copy_from(const Tensor& src);                       // same shape; converts dtype
  void zero_();
  void fill_(double value);

  // Element access for tests and small tools (slow).
  double item_at(int64_t flat_index) const;  // contiguous flat index
  double item() const { return item_at(0); }
  template <typename T>
  std::vector<T> to_vector() const;

 private:
  Shape shape_;
  std::vector<int64_t> strides_;
  DType dtype_ = DType::kF32;
  int64_t offset_ = 0;  // in elements
  std::shared_ptr<Storage> storage_;
};

template <typename T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values) {
  WEFT_CHECK(shape_numel(shape) == int64_t(values.size()), "from_vector: shape ", shape_str(shape),
             " holds ", shape_numel(shape), " elements, got ", values.size());
  Tensor t = empty(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

}  // namespace weft::core
