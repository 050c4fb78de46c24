// Tensor storage, views and copies.
#include "core/tensor.h"

#include <cstring>
#include <sstream>

namespace weft::core {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

Storage::Storage(size_t bytes, Device device, memory::Allocator& alloc, memory::Tag tag)
    : data_(alloc.allocate(bytes, tag)), bytes_(bytes), device_(device), alloc_(&alloc) {}

Storage::~Storage() { alloc_->free(data_); }

static std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (int64_t i = int64_t(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, memory::Allocator* alloc, memory::Tag tag) {
  return empty_on(Device::cpu(), shape, dtype, alloc ? *alloc : memory::default_host_allocator(),
                  tag);
}

Tensor Tensor::empty_on(Device device, const Shape& shape, DType dtype, memory::Allocator& alloc,
                        memory::Tag tag) {
  for (int64_t d : shape) WEFT_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dtype), device,
                                         alloc, tag);
  return t;
}

// Host-only operations dereference the storage; on a device tensor that would crash.
static void check_host(const Tensor& t, const char* what) {
  WEFT_CHECK(t.device().is_cpu(), what, " on a tensor on ", t.device().to_string(),
             " (host-only; copy it to the host first)");
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, memory::Allocator* alloc, memory::Tag tag) {
  Tensor t = empty(shape, dtype, alloc, tag);
  t.zero_();
  return t;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

void* Tensor::raw_data() const {
  WEFT_CHECK(defined(), "use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  WEFT_CHECK(is_contiguous(), "view() needs a contiguous tensor");
  WEFT_CHECK(shape_numel(shape) == numel(), "view ", shape_str(shape_), " as ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t length) const {
  if (d < 0) d += dim();
  WEFT_CHECK(d >= 0 && d < dim() && start >= 0 && length >= 0 && start + length <= shape_[d],
             "slice(", d, ", ", start, ", ", length, ") of ", shape_str(shape_));
  Tensor t = *this;
  t.shape_[d] = length;
  t.offset_ += start * strides_[d];
  return t;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  Tensor t = slice(d, index, 1);
  if (d < 0) d += dim();
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

namespace {

// Visits every element of a strided tensor in row-major order.
template <typename F>
void for_each_offset(const Shape& shape, const std::vector<int64_t>& strides, F&& f) {
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

double load_as_double(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF64: return static_cast<const double*>(base)[i];
    case DType::kBF16: return bf16_to_float(static_cast<const bf16*>(base)[i]);
    case DType::kI32: return static_cast<const int32_t*>(base)[i];
    case DType::kI64: return double(static_cast<const int64_t*>(base)[i]);
    case DType::kU8: return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

void store_from_double(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = float(v); break;
    case DType::kF64: static_cast<double*>(base)[i] = v; break;
    case DType::kBF16: static_cast<bf16*>(base)[i] = float_to_bf16(float(v)); break;
    case DType::kI32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case DType::kI64: static_cast<int64_t*>(base)[i] = int64_t(v); break;
    case DType::kU8: static_cast<uint8_t*>(base)[i] = uint8_t(v); break;
  }
}

}  // namespace

void Tensor::copy_from(const Tensor& src) {
  check_host(*this, "copy_from");
  check_host(src, "copy_from");
  WEFT_CHECK(src.shape_ == shape_, "copy_from: shape ", shape_str(src.shape_), " into ",
             shape_str(shape_));
  if (src.dtype_ == dtype_ && src.is_contiguous() && is_contiguous()) {
    if (raw_data() != src.raw_data()) std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  // General path: gather source elements in row-major order, scatter to destination.
  std::vector<double> tmp(static_cast<size_t>(numel()));
  const void* sb = src.raw_data();
  for_each_offset(src.shape_, src.strides_,
                  [&](int64_t i, int64_t off) { tmp[i] = load_as_double(sb, src.dtype_, off); });
  void* db = raw_data();
  for_each_offset(shape_, strides_,
                  [&](int64_t i, int64_t off) { store_from_double(db, dtype_, off, tmp[i]); });
}

Tensor Tensor::clone(memory::Allocator* alloc) const {
  Tensor t = empty(shape_, dtype_, alloc);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  check_host(*this, "zero_");
  if (is_contiguous()) {
    std::memset(raw_data(), 0, nbytes());
  } else {
    fill_(0.0);
  }
}

void Tensor::fill_(double value) {
  check_host(*this, "fill_");
  void* b = raw_data();
  for_each_offset(shape_, strides_,
                  [&](int64_t, int64_t off) { store_from_double(b, dtype_, off, value); });
}

double Tensor::item_at(int64_t flat_index) const {
  WEFT_CHECK(is_contiguous() && flat_index >= 0 && flat_index < numel(), "item_at(", flat_index,
             ") of ", shape_str(shape_));
  check_host(*this, "item_at");
  return load_as_double(raw_data(), dtype_, flat_index);
}

}  // namespace weft::core
