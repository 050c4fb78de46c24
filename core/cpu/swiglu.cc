// The gated product of Llama's MLP, out = silu(gate) * up, fused so that the SwiGLU
// block needs one pass (and no saved silu(gate)) on each side.
#include <cmath>

#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"
#include "core/cpu/vmath.h"

namespace weft::core::cpu {
namespace {

// e^(-g) with the exponent capped at 80, as GELU does: sigmoid stays a normal float
// (subnormals cost ~100x per operation) and e * s never becomes inf * 0. The true
// values there are below 1e-34.
template <typename T>
T exp_neg(T g) {
  const T z = -g;
  return detail::vexp(z < T(80) ? z : T(80));
}

}  // namespace

template <typename T>
void swiglu_forward(const T* gate, const T* up, T* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i];
    out[i] = g / (T(1) + exp_neg(g)) * up[i];
  }
}

namespace {

// s = sigmoid(g) = 1 / (1 + e), e = e^(-g); silu'(g) = s + g s (1 - s) with 1 - s = e s,
// which keeps full precision when s is close to 1.
template <typename T, bool kAccumulate>
void swiglu_backward_loop(const T* dout, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
  // One loop per value of the flag: a `accumulate ? dgate[i] + dg : dg` inside the loop is a
  // conditional load, which GCC does not vectorise (the loop ran scalar, 8x the forward).
#pragma omp parallel for simd schedule(static) if (parallel : detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i], e = exp_neg(g);
    const T s = T(1) / (T(1) + e);
    const T dg = dout[i] * up[i] * (s + g * s * (e * s));
    const T du = dout[i] * (g * s);
    if constexpr (kAccumulate) {
      dgate[i] += dg;
      dup[i] += du;
    } else {
      dgate[i] = dg;
      dup[i] = du;
    }
  }
}

}  // namespace

template <typename T>
void swiglu_backward(const T* dout, const T* gate, const T* up, T* dgate, T* dup, bool accumulate,
                     int64_t n) {
  if (accumulate)
    swiglu_backward_loop<T, true>(dout, gate, up, dgate, dup, n);
  else
    swiglu_backward_loop<T, false>(dout, gate, up, dgate, dup, n);
}

template void swiglu_forward<float>(const float*, const float*, float*, int64_t);
template void swiglu_forward<double>(const double*, const double*, double*, int64_t);
template void swiglu_backward<float>(const float*, const float*, const float*, float*, float*, bool,
                                     int64_t);
template void swiglu_backward<double>(const double*, const double*, const double*, double*, double*,
                                      bool, int64_t);

}  // namespace weft::core::cpu
