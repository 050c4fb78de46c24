// Cross-entropy with logits: log-sum-exp after subtracting the row maximum, row sums
// and the mean loss accumulated in double (the mean is summed in row order, so it does
// not depend on the thread count).
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"
#include "core/cpu/vmath.h"

namespace weft::core::cpu {

// logits, probs (N,V); targets, losses (N). losses may be null too.
template <typename T>
double cross_entropy_forward(const T* logits, const int32_t* targets,
                             std::type_identity_t<T>* losses, std::type_identity_t<T>* probs,
                             int64_t N, int64_t V) {
  WEFT_CHECK(N > 0 && V > 0, "cross_entropy_forward: bad sizes N=", N, " V=", V);
  detail::check_ids(targets, N, V, "target id");
  std::vector<double> row_loss(static_cast<size_t>(N));
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = x[j] > mx ? x[j] : mx;
    double s = 0;
    if (probs) {
      T* p = probs + n * V;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) p[j] = detail::vexp(x[j] - mx);
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < V; ++j) s += double(p[j]);
      const T inv = T(1.0 / s);
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) p[j] *= inv;
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < V; ++j) s += double(detail::vexp(x[j] - mx));
    }
    const double l = double(mx) + std::log(s) - double(x[targets[n]]);
    row_loss[size_t(n)] = l;
    if (losses) losses[n] = T(l);
  }
  double total = 0;
  for (double l : row_loss) total += l;
  return total / double(N);
}

// dlogits = (probs - onehot(target)) * dloss
template <typename T>
void cross_entropy_backward(const T* probs, const int32_t* targets, T dloss, T* dlogits,
                            bool accumulate, int64_t N, int64_t V) {
  WEFT_CHECK(N >= 0 && V > 0, "cross_entropy_backward: bad sizes N=", N, " V=", V);
  detail::check_ids(targets, N, V, "target id");
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
    d[targets[n]] -= dloss;
  }
}

template double cross_entropy_forward<float>(const float*, const int32_t*, float*, float*, int64_t,
                                             int64_t);
template double cross_entropy_forward<double>(const double*, const int32_t*, double*, double*,
                                              int64_t, int64_t);
template void cross_entropy_backward<float>(const float*, const int32_t*, float, float*, bool,
                                            int64_t, int64_t);
template void cross_entropy_backward<double>(const double*, const int32_t*, double, double*, bool,
                                             int64_t, int64_t);

}  // namespace weft::core::cpu
