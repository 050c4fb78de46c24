// Kernel bindings of the optimizer ops: the global gradient norm and AdamW.
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/graph/op_impls.h"

namespace weft::core::ops {

// Sum of squares per gradient in parameter order, added in double: the same order on
// every run, so the norm is bitwise reproducible.
void run_global_norm(OpContext& c) {
  double total = 0.0;
  for (Tensor* g : c.in) {
    if (g->dtype() == DType::kF32) total += cpu::sum_squares<float>(g->data<float>(), g->numel());
    else total += cpu::sum_squares<double>(g->data<double>(), g->numel());
  }
  c.out[0]->data<double>()[0] = std::sqrt(total);
}

// Clipping as the reference does it: scale = min(1, clip / (norm + 1e-6)).
static double clip_scale(double norm, double grad_clip) {
  return grad_clip > 0 ? std::min(1.0, grad_clip / (norm + 1e-6)) : 1.0;
}

void run_adamw(OpContext& c) {
  Tensor &p = *c.in[0], &g = *c.in[1], &m = *c.in[2], &v = *c.in[3];
  double norm = c.in[4]->data<double>()[0];
  // A non-finite global norm (a NaN/Inf gradient anywhere, or a non-finite loss folded into
  // it) drops the step: p, m and v stay as they were. The norm is global (all-reduced in
  // multi-rank plans), so every rank and shard drops the same step with no extra collective.
  if (!std::isfinite(norm)) return;
  const Attrs& a = c.op.attrs;
  cpu::AdamWParams hp{c.scalars.lr, a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay"),
                      c.scalars.step + 1, clip_scale(norm, a.f("grad_clip"))};
  bool decay = a.i("decay") != 0;
  if (p.dtype() == DType::kF32)
    cpu::adamw_update<float>(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(),
                             p.numel(), hp, decay);
  else
    cpu::adamw_update<double>(p.data<double>(), g.data<double>(), m.data<double>(),
                              v.data<double>(), p.numel(), hp, decay);
}

}  // namespace weft::core::ops
