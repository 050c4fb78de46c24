// Internal: small helpers the CPU kernel bindings (core/graph/ops_*.cc) share: dispatch on
// the element type and the outputs of backward ops that autodiff may skip.
#pragma once

#include <string>

#include "base/check.h"
#include "core/graph/op_table.h"

namespace weft::core::ops::bind {

// Calls f.template operator()<T>() for the floating type of `t`.
template <typename F>
void dispatch_float(const Tensor& t, F&& f) {
  if (t.dtype() == DType::kF32) f.template operator()<float>();
  else if (t.dtype() == DType::kF64) f.template operator()<double>();
  else throw NotSupported(str("CPU op on dtype ", dtype_name(t.dtype())));
}

// Rows of a (..., last) tensor: the product of all but the last dim.
inline int64_t rows(const Tensor& t) { return t.numel() / t.size(-1); }

// Position in c.out of annotation output k (skipped outputs are not allocated).
inline int out_position(const OpContext& c, int k) {
  int idx = 0;
  for (int j = 0; j < k; ++j)
    if (!c.op.attrs.i_or("skip_out" + std::to_string(j), 0)) idx++;
  return idx;
}
// The k-th output of a backward op, or nullptr when autodiff skipped it.
inline Tensor* out_or_null(OpContext& c, int k) {
  if (c.op.attrs.i_or("skip_out" + std::to_string(k), 0)) return nullptr;
  return c.out.at(size_t(out_position(c, k)));
}
inline bool acc_of(OpContext& c, int k) { return c.op.accumulate.at(size_t(out_position(c, k))); }
template <typename T>
T* ptr(Tensor* t) {
  return t ? t->data<T>() : nullptr;
}

}  // namespace weft::core::ops::bind
