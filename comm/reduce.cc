// Reduction kernels per dtype and op. Integer sums wrap through the unsigned type so that
// overflow is defined and identical on every backend.
#include "comm/reduce.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "base/check.h"

namespace weft::comm {

namespace {

template <typename T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return T(U(a) + U(b));
  } else {
    return a + b;
  }
}

template <typename T>
void reduce_typed(T* out, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) out[i] = add(a[i], b[i]);
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      return;
  }
}

void reduce_bf16(core::bf16* out, const core::bf16* a, const core::bf16* b, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    float x = core::bf16_to_float(a[i]), y = core::bf16_to_float(b[i]);
    float r = op == ReduceOp::kMax ? std::max(x, y) : op == ReduceOp::kMin ? std::min(x, y) : x + y;
    out[i] = core::float_to_bf16(r);
  }
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

void reduce_elements(void* out, const void* a, const void* b, size_t n, core::DType dtype,
                     ReduceOp op) {
  using core::DType;
  switch (dtype) {
    case DType::kF32:
      return reduce_typed(static_cast<float*>(out), static_cast<const float*>(a),
                          static_cast<const float*>(b), n, op);
    case DType::kF64:
      return reduce_typed(static_cast<double*>(out), static_cast<const double*>(a),
                          static_cast<const double*>(b), n, op);
    case DType::kI32:
      return reduce_typed(static_cast<int32_t*>(out), static_cast<const int32_t*>(a),
                          static_cast<const int32_t*>(b), n, op);
    case DType::kI64:
      return reduce_typed(static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                          static_cast<const int64_t*>(b), n, op);
    case DType::kU8:
      return reduce_typed(static_cast<uint8_t*>(out), static_cast<const uint8_t*>(a),
                          static_cast<const uint8_t*>(b), n, op);
    case DType::kBF16:
      return reduce_bf16(static_cast<core::bf16*>(out), static_cast<const core::bf16*>(a),
                         static_cast<const core::bf16*>(b), n, op);
  }
  WEFT_CHECK(false, "reduce_elements: unknown dtype");
}

void divide_elements(void* data, size_t n, core::DType dtype, int divisor) {
  using core::DType;
  WEFT_CHECK(divisor > 0, "divide_elements: divisor ", divisor);
  if (divisor == 1) return;
  auto divide = [&]<typename T>(T* p) {
    for (size_t i = 0; i < n; ++i) p[i] = T(p[i] / T(divisor));
  };
  switch (dtype) {
    case DType::kF32:
      return divide(static_cast<float*>(data));
    case DType::kF64:
      return divide(static_cast<double*>(data));
    case DType::kI32:
      return divide(static_cast<int32_t*>(data));
    case DType::kI64:
      return divide(static_cast<int64_t*>(data));
    case DType::kU8:
      return divide(static_cast<uint8_t*>(data));
    case DType::kBF16: {
      auto* p = static_cast<core::bf16*>(data);
      for (size_t i = 0; i < n; ++i)
        p[i] = core::float_to_bf16(core::bf16_to_float(p[i]) / float(divisor));
      return;
    }
  }
  WEFT_CHECK(false, "divide_elements: unknown dtype");
}

}  // namespace weft::comm
