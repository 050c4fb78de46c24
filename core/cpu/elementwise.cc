// Element-wise vector kernels and the sum of squares used by gradient clipping.
#include <algorithm>
#include <vector>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"

namespace weft::core::cpu {
namespace {

// Block size of the sum-of-squares reduction. Each block is summed by one thread in a
// fixed order and the block sums are added in block order, so the result has the same
// bits for every thread count (the gradient norm feeds clipping and the metrics).
constexpr int64_t kSumBlock = 8192;

}  // namespace

template <typename T>
void add(const T* a, const T* b, T* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <typename T>
void axpy(T alpha, const T* x, T* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template <typename T>
void scale(T alpha, T* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

template <typename T>
double sum_squares(const T* x, int64_t n) {
  WEFT_CHECK(n >= 0, "sum_squares: negative length ", n);
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (parallel : blocks > 1)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t i0 = k * kSumBlock, i1 = std::min(n, i0 + kSumBlock);
    // The simd reduction fixes one summation order per compiled binary (lanes, then a
    // lane combine), independent of which thread runs the block.
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) s += double(x[i]) * double(x[i]);
    partial[size_t(k)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template void add<float>(const float*, const float*, float*, int64_t);
template void add<double>(const double*, const double*, double*, int64_t);
template void axpy<float>(float, const float*, float*, int64_t);
template void axpy<double>(double, const double*, double*, int64_t);
template void scale<float>(float, float*, int64_t);
template void scale<double>(double, double*, int64_t);
template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

}  // namespace weft::core::cpu
