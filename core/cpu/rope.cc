// Rotary position embedding in the rotate-half convention of Hugging Face's Llama: the
// first and second halves of each head's dimensions pair up. The cos/sin table is built
// per call in double from the angle t * theta^(-2j/hs), as the float64 reference does;
// transformers builds it in float32, which drifts by ~1e-7 relative for long sequences.
#include <cmath>
#include <vector>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/cpu/loops.h"

namespace weft::core::cpu {
namespace {

// cos and sin (T, hs/2) of pair j at position t.
template <typename T>
void rope_table(int64_t Tn, int64_t half, double theta, std::vector<T>& cos_t,
                std::vector<T>& sin_t) {
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j)
    inv_freq[size_t(j)] = 1.0 / std::pow(theta, double(2 * j) / double(2 * half));
  cos_t.resize(size_t(Tn * half));
  sin_t.resize(size_t(Tn * half));
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(Tn * half * 16))
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t j = 0; j < half; ++j) {
      const double angle = double(t) * inv_freq[size_t(j)];
      cos_t[size_t(t * half + j)] = T(std::cos(angle));
      sin_t[size_t(t * half + j)] = T(std::sin(angle));
    }
}

// y = R(sign * angle) x per pair; sign -1 is the transpose (backward). Each pair is read
// before it is written, so y may equal x when not accumulating.
template <typename T>
void rotate(const T* x, T* y, bool accumulate, int64_t B, int64_t Tn, int64_t heads, int64_t hs,
            double theta, T sign, const char* what) {
  WEFT_CHECK(B >= 0 && Tn >= 0 && heads > 0 && hs > 0, what, ": bad sizes B=", B, " T=", Tn,
             " heads=", heads, " hs=", hs);
  WEFT_CHECK(hs % 2 == 0, what, ": head size ", hs, " must be even to pair its halves");
  WEFT_CHECK(theta > 0, what, ": theta must be positive, got ", theta);
  const int64_t half = hs / 2, width = heads * hs;
  std::vector<T> cos_t, sin_t;
  rope_table(Tn, half, theta, cos_t, sin_t);
#pragma omp parallel for schedule(static) if (parallel : detail::worth_threads(B * Tn * width))
  for (int64_t row = 0; row < B * Tn; ++row) {
    const int64_t t = row % Tn;
    const T* cs = cos_t.data() + t * half;
    const T* sn = sin_t.data() + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      const T* a = x + row * width + h * hs;  // first half; b = a + half
      T* ya = y + row * width + h * hs;
      if (accumulate) {
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          const T x1 = a[j], x2 = a[j + half], s = sign * sn[j];
          ya[j] += x1 * cs[j] - x2 * s;
          ya[j + half] += x2 * cs[j] + x1 * s;
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          const T x1 = a[j], x2 = a[j + half], s = sign * sn[j];
          ya[j] = x1 * cs[j] - x2 * s;
          ya[j + half] = x2 * cs[j] + x1 * s;
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward(const T* x, T* y, int64_t B, int64_t Tn, int64_t heads, int64_t hs,
                  double theta) {
  rotate(x, y, false, B, Tn, heads, hs, theta, T(1), "rope_forward");
}

template <typename T>
void rope_backward(const T* dy, T* dx, bool accumulate_dx, int64_t B, int64_t Tn, int64_t heads,
                   int64_t hs, double theta) {
  WEFT_CHECK(!(accumulate_dx && dx == dy), "rope_backward: cannot accumulate in place");
  rotate(dy, dx, accumulate_dx, B, Tn, heads, hs, theta, T(-1), "rope_backward");
}

template void rope_forward<float>(const float*, float*, int64_t, int64_t, int64_t, int64_t, double);
template void rope_forward<double>(const double*, double*, int64_t, int64_t, int64_t, int64_t,
                                   double);
template void rope_backward<float>(const float*, float*, bool, int64_t, int64_t, int64_t, int64_t,
                                   double);
template void rope_backward<double>(const double*, double*, bool, int64_t, int64_t, int64_t,
                                    int64_t, double);

}  // namespace weft::core::cpu
