// Token plus position embedding. The backward scatter-add is partitioned by columns,
// so repeated tokens never race and every column is summed in (b, t) order whatever
// the thread count.
#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"

namespace weft::core::cpu {

// tokens (B,T), wte (V,C), wpe (>=T,C), out (B,T,C).
template <typename T>
void embedding_forward(const int32_t* tokens, const T* wte, const T* wpe, T* out, int64_t B,
                       int64_t Tn, int64_t C, int64_t V) {
  WEFT_CHECK(B >= 0 && Tn >= 0 && C >= 0 && V > 0, "embedding_forward: bad sizes B=", B, " T=", Tn,
             " C=", C, " V=", V);
  detail::check_ids(tokens, B * Tn, V, "token id");
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(B * Tn * C))
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const T* e = wte + int64_t(tokens[bt]) * C;
    const T* p = wpe + (bt % Tn) * C;
    T* o = out + bt * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

// dwte (V,C) += scatter of dout rows by token; dwpe (>=T,C) += sum over b of dout[b, t];
// each skipped when null.
// The ids were range-checked by the forward pass; negative ids are still refused here.
template <typename T>
void embedding_backward(const T* dout, const int32_t* tokens, std::type_identity_t<T>* dwte,
                        std::type_identity_t<T>* dwpe, int64_t B, int64_t Tn, int64_t C) {
  WEFT_CHECK(B >= 0 && Tn >= 0 && C >= 0, "embedding_backward: bad sizes B=", B, " T=", Tn,
             " C=", C);
  for (int64_t i = 0; i < B * Tn; ++i)
    WEFT_CHECK(tokens[i] >= 0, "token id ", tokens[i], " at position ", i, " is negative");
  if (C == 0 || (!dwte && !dwpe)) return;
  detail::parallel_columns(C, B * Tn * C, [&](int64_t c0, int64_t c1) {
    const int64_t len = c1 - c0;
    for (int64_t bt = 0; bt < B * Tn; ++bt) {
      const T* g = dout + bt * C + c0;
      if (dwte) {
        T* e = dwte + int64_t(tokens[bt]) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < len; ++c) e[c] += g[c];
      }
      if (dwpe) {
        T* p = dwpe + (bt % Tn) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < len; ++c) p[c] += g[c];
      }
    }
  });
}

template void embedding_forward<float>(const int32_t*, const float*, const float*, float*, int64_t,
                                       int64_t, int64_t, int64_t);
template void embedding_forward<double>(const int32_t*, const double*, const double*, double*,
                                        int64_t, int64_t, int64_t, int64_t);
template void embedding_backward<float>(const float*, const int32_t*, float*, float*, int64_t,
                                        int64_t, int64_t);
template void embedding_backward<double>(const double*, const int32_t*, double*, double*, int64_t,
                                         int64_t, int64_t);

}  // namespace weft::core::cpu
