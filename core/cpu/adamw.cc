// AdamW as in shared/reference/README.md: scale the gradient (clipping), decay the
// weight first (p *= 1 - lr * wd, matrices only: the caller passes `decay`), update the
// moments, then the bias-corrected step with eps outside the square root.
#include <cmath>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"

namespace weft::core::cpu {

template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWParams& hp, bool decay) {
  WEFT_CHECK(hp.step >= 1, "adamw_update: step counts from 1, got ", hp.step);
  WEFT_CHECK(n >= 0, "adamw_update: negative length ", n);
  // Bias corrections in double: beta^step underflows gracefully and loses nothing for
  // small steps where 1 - beta^step is tiny.
  const double bc1 = 1.0 - std::pow(double(hp.beta1), double(hp.step));
  const double bc2 = 1.0 - std::pow(double(hp.beta2), double(hp.step));
  const T lr = T(hp.lr), b1 = T(hp.beta1), b2 = T(hp.beta2), eps = T(hp.eps);
  const T inv_bc1 = T(1.0 / bc1), inv_bc2 = T(1.0 / bc2);
  const T keep = decay ? T(1.0 - double(hp.lr) * double(hp.weight_decay)) : T(1);
  const T gs = T(hp.grad_scale);
  // Bandwidth-bound (seven streams). GCC keeps the loop scalar because of sqrt's errno
  // path; a vectorised build (-fno-math-errno) measured no faster.
#pragma omp parallel for simd schedule(static) if (parallel : detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i] * gs;
    const T mi = b1 * m[i] + (T(1) - b1) * gi;
    const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * keep - lr * (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps);
  }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&,
                                  bool);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const AdamWParams&, bool);

}  // namespace weft::core::cpu
