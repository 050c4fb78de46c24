// Kernels on a slice [offset, offset+V) of the vocabulary: the embedding table's rows and
// cross-entropy's logit columns, for vocabulary-parallel layouts. Arithmetic follows
// embedding.cc and cross_entropy.cc, so one slice holding everything gives their results.
#include <cmath>
#include <limits>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"
#include "core/cpu/vmath.h"

namespace weft::core::cpu {
namespace {

void check_non_negative(const int32_t* ids, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    WEFT_CHECK(ids[i] >= 0, what, " ", ids[i], " at position ", i, " is negative");
}

}  // namespace

template <typename T>
void embedding_slice_forward(const int32_t* tokens, const T* wte, const std::type_identity_t<T>* wpe,
                             T* out, int64_t B, int64_t Tn, int64_t C, int64_t V, int64_t offset) {
  WEFT_CHECK(B >= 0 && Tn >= 0 && C >= 0 && V >= 0 && offset >= 0, "embedding_slice_forward: bad sizes B=",
             B, " T=", Tn, " C=", C, " V=", V, " offset=", offset);
  check_non_negative(tokens, B * Tn, "token id");
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(B * Tn * C))
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const int64_t row = int64_t(tokens[bt]) - offset;
    const bool in = row >= 0 && row < V;
    const T* e = wte + (in ? row : 0) * C;
    const T* p = wpe ? wpe + (bt % Tn) * C : nullptr;
    T* o = out + bt * C;
    if (in && p) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else if (in) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
    } else if (p) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = p[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = T(0);
    }
  }
}

template <typename T>
void embedding_slice_backward(const T* dout, const int32_t* tokens, std::type_identity_t<T>* dwte,
                              std::type_identity_t<T>* dwpe, int64_t B, int64_t Tn, int64_t C, int64_t V,
                              int64_t offset) {
  WEFT_CHECK(B >= 0 && Tn >= 0 && C >= 0 && V >= 0 && offset >= 0, "embedding_slice_backward: bad sizes B=",
             B, " T=", Tn, " C=", C, " V=", V, " offset=", offset);
  check_non_negative(tokens, B * Tn, "token id");
  if (C == 0 || (!dwte && !dwpe)) return;
  detail::parallel_columns(C, B * Tn * C, [&](int64_t c0, int64_t c1) {
    const int64_t len = c1 - c0;
    for (int64_t bt = 0; bt < B * Tn; ++bt) {
      const T* g = dout + bt * C + c0;
      const int64_t row = int64_t(tokens[bt]) - offset;
      if (dwte && row >= 0 && row < V) {
        T* e = dwte + row * C + c0;
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

template <typename T>
void cross_entropy_slice_max(const T* logits, double* row_max, int64_t N, int64_t V) {
  WEFT_CHECK(N >= 0 && V > 0, "cross_entropy_slice_max: bad sizes N=", N, " V=", V);
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = x[j] > mx ? x[j] : mx;
    row_max[n] = double(mx);
  }
}

template <typename T>
void cross_entropy_slice_sumexp(const T* logits, const int32_t* targets, const double* row_max,
                                double* sum_exp, double* target_logit, int64_t N, int64_t V, int64_t offset) {
  WEFT_CHECK(N >= 0 && V > 0, "cross_entropy_slice_sumexp: bad sizes N=", N, " V=", V);
  check_non_negative(targets, N, "target id");
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    const T mx = T(row_max[n]);  // the max is one of the logits: exact in T
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; ++j) s += double(detail::vexp(x[j] - mx));
    sum_exp[n] = s;
    const int64_t t = int64_t(targets[n]) - offset;
    target_logit[n] = t >= 0 && t < V ? double(x[t]) : 0.0;
  }
}

template <typename T>
double cross_entropy_slice_finish(const T* logits, const double* row_max, const double* sum_exp,
                                  const double* target_logit, std::type_identity_t<T>* probs, int64_t N,
                                  int64_t V) {
  WEFT_CHECK(N > 0 && V > 0, "cross_entropy_slice_finish: bad sizes N=", N, " V=", V);
  if (probs) {
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * V))
    for (int64_t n = 0; n < N; ++n) {
      const T* x = logits + n * V;
      T* p = probs + n * V;
      const T mx = T(row_max[n]);
      const T inv = T(1.0 / sum_exp[n]);
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) p[j] = detail::vexp(x[j] - mx) * inv;
    }
  }
  double total = 0;
  for (int64_t n = 0; n < N; ++n) total += row_max[n] + std::log(sum_exp[n]) - target_logit[n];
  return total / double(N);
}

template <typename T>
void cross_entropy_slice_backward(const T* probs, const int32_t* targets, T dloss, T* dlogits,
                                  bool accumulate, int64_t N, int64_t V, int64_t offset) {
  WEFT_CHECK(N >= 0 && V > 0, "cross_entropy_slice_backward: bad sizes N=", N, " V=", V);
  check_non_negative(targets, N, "target id");
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* p = probs + n * V;
    T* d = dlogits + n * V;
    if (accumulate) {
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] += p[j] * dloss;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] = p[j] * dloss;
    }
    const int64_t t = int64_t(targets[n]) - offset;
    if (t >= 0 && t < V) d[t] -= dloss;
  }
}

#define WEFT_VOCAB_SLICE_INSTANTIATE(T)                                                                   \
  template void embedding_slice_forward<T>(const int32_t*, const T*, const T*, T*, int64_t, int64_t,      \
                                           int64_t, int64_t, int64_t);                                    \
  template void embedding_slice_backward<T>(const T*, const int32_t*, T*, T*, int64_t, int64_t, int64_t, \
                                            int64_t, int64_t);                                            \
  template void cross_entropy_slice_max<T>(const T*, double*, int64_t, int64_t);                          \
  template void cross_entropy_slice_sumexp<T>(const T*, const int32_t*, const double*, double*, double*,  \
                                              int64_t, int64_t, int64_t);                                 \
  template double cross_entropy_slice_finish<T>(const T*, const double*, const double*, const double*,    \
                                                T*, int64_t, int64_t);                                    \
  template void cross_entropy_slice_backward<T>(const T*, const int32_t*, T, T*, bool, int64_t, int64_t,  \
                                                int64_t);
WEFT_VOCAB_SLICE_INSTANTIATE(float)
WEFT_VOCAB_SLICE_INSTANTIATE(double)
#undef WEFT_VOCAB_SLICE_INSTANTIATE

}  // namespace weft::core::cpu
