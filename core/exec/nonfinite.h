// Finiteness checks for the non-finite step guard (train.on_nonfinite) and for weights a
// user gives (--init-weights): whether a tensor holds only finite values, and its sum of squares.
#pragma once

#include "core/tensor.h"

namespace weft::core {

// True when every element of `t` (f32, f64 or bf16; any strides) is finite; integer tensors
// are always finite.
bool all_finite(const Tensor& t);

// Sum of the squares of `t`'s elements in double (f32 or f64): NaN or Inf when one is.
double sum_squares(const Tensor& t);

}  // namespace weft::core
