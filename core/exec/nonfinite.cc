// all_finite and sum_squares over tensors of any float type and strides.
#include "core/exec/nonfinite.h"

#include <cmath>

#include "base/check.h"
#include "core/cpu/kernels.h"

namespace weft::core {

bool all_finite(const Tensor& t) {
  if (t.numel() == 0) return true;
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF64 && t.dtype() != DType::kBF16)
    return true;  // integer tensors (token ids) cannot hold NaN or Inf
  // A sum of squares is finite iff every element is, unless it overflows: then scan.
  Tensor c = t.dtype() == DType::kBF16 ? t.to(DType::kF32) : t.contiguous();
  if (std::isfinite(sum_squares(c))) return true;
  if (c.dtype() == DType::kF32) {
    const float* p = c.data<float>();
    for (int64_t i = 0; i < c.numel(); ++i)
      if (!std::isfinite(p[i])) return false;
  } else {
    const double* p = c.data<double>();
    for (int64_t i = 0; i < c.numel(); ++i)
      if (!std::isfinite(p[i])) return false;
  }
  return true;
}

double sum_squares(const Tensor& t) {
  Tensor c = t.contiguous();
  if (c.dtype() == DType::kF32) return cpu::sum_squares<float>(c.data<float>(), c.numel());
  WEFT_CHECK(c.dtype() == DType::kF64, "sum_squares: f32 or f64, got ", dtype_name(c.dtype()));
  return cpu::sum_squares<double>(c.data<double>(), c.numel());
}

}  // namespace weft::core
