// MoE stage kernels. Sums over a token's slots run in slot order and the routing state is
// recomputed from the probabilities, so the result never depends on how rows were dispatched.
#include "core/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/check.h"
#include "core/cpu/kernels.h"

namespace weft::core::cpu {
namespace {

// Position in route of every assignment token*k + slot (-1: dropped).
std::vector<int64_t> route_positions(const int32_t* route, int64_t A) {
  std::vector<int64_t> pos(size_t(A), -1);
  for (int64_t p = 0; p < A && route[2 * p] >= 0; ++p) {
    WEFT_CHECK(route[2 * p] < A, "moe route row ", p, " names assignment ", route[2 * p], " of ", A);
    pos[size_t(route[2 * p])] = p;
  }
  return pos;
}

}  // namespace

template <typename T>
MoeTopK moe_top_k(const T* probs, int64_t N, int64_t E, int64_t k, const float* bias) {
  WEFT_CHECK(k >= 1 && k <= E, "moe top_k ", k, " with ", E, " experts");
  MoeTopK r{N, E, k, std::vector<int32_t>(size_t(N * k)), std::vector<double>(size_t(N * k)),
            std::vector<double>(size_t(N))};
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* p = probs + n * E;
    std::vector<int32_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    if (bias) {
      std::vector<double> score(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) score[size_t(e)] = double(p[e]) + double(bias[e]);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
      });
    } else {
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                        [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    }
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += double(p[idx[size_t(j)]]);
    r.sum[size_t(n)] = s;
    for (int64_t j = 0; j < k; ++j) {
      r.expert[size_t(n * k + j)] = idx[size_t(j)];
      r.weight[size_t(n * k + j)] = double(p[idx[size_t(j)]]) / s;
    }
  }
  return r;
}

int64_t moe_capacity(double cf, int64_t N, int64_t k, int64_t E) {
  return cf <= 0 ? N * k : int64_t(std::ceil(cf * double(N * k) / double(E)));
}

int64_t moe_route_kept(const int32_t* route, int64_t A) {
  int64_t a = 0;
  while (a < A && route[2 * a] >= 0) ++a;
  return a;
}

template <typename T>
double moe_route_forward(const T* y, const T* router, T* logits, T* probs, int32_t* route, T* xe,
                         int64_t N, int64_t C, int64_t E, int64_t k, double capacity_factor,
                         const float* bias, double* counts, double* prob_sums) {
  linear_forward<T>(y, router, nullptr, logits, N, C, E);
  softmax_forward<T>(logits, probs, N, E);
  MoeTopK r = moe_top_k(probs, N, E, k, bias);

  // Balance loss E * sum_e f_e P_e over these tokens (f counted before dropping).
  std::vector<double> f(size_t(E), 0.0), P(size_t(E), 0.0);
  for (int64_t a = 0; a < N * k; ++a) f[size_t(r.expert[size_t(a)])] += 1.0 / double(N * k);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) P[size_t(e)] += double(probs[n * E + e]) / double(N);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += f[size_t(e)] * P[size_t(e)];
  if (counts) {
    std::fill(counts, counts + E, 0.0);
    for (int64_t a = 0; a < N * k; ++a) counts[r.expert[size_t(a)]] += 1.0;
  }
  if (prob_sums) {
    std::fill(prob_sums, prob_sums + E, 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e) prob_sums[e] += double(probs[n * E + e]);
  }

  // Dispatch: by expert, then token order; the first `cap` assignments of an expert stay.
  const int64_t cap = moe_capacity(capacity_factor, N, k, E);
  int64_t a = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t taken = 0;
    for (int64_t n = 0; n < N && taken < cap; ++n)
      for (int64_t j = 0; j < k; ++j)
        if (r.expert[size_t(n * k + j)] == e && taken < cap) {
          route[2 * a] = int32_t(n * k + j);
          route[2 * a + 1] = int32_t(e);
          ++a, ++taken;
        }
  }
  for (int64_t p = a; p < N * k; ++p) route[2 * p] = route[2 * p + 1] = -1;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < a; ++p)
    std::copy(y + (route[2 * p] / k) * C, y + (route[2 * p] / k + 1) * C, xe + p * C);
  return double(E) * aux;
}

template <typename T>
void moe_experts_forward(const T* xe, const T* fc_w, const std::type_identity_t<T>* fc_b,
                         const T* proj_w, const std::type_identity_t<T>* proj_b, T* he, T* ge, T* ye,
                         const int64_t* seg_expert, const int64_t* seg_rows, int64_t segments,
                         int64_t C, int64_t F) {
  int64_t s = 0;
  for (int64_t i = 0; i < segments; s += seg_rows[i], ++i) {
    const int64_t rows = seg_rows[i], e = seg_expert[i];
    if (rows == 0) continue;
    linear_forward<T>(xe + s * C, fc_w + e * F * C, fc_b ? fc_b + e * F : nullptr, he + s * F, rows, C,
                      F);
    gelu_forward<T>(he + s * F, ge + s * F, rows * F);
    linear_forward<T>(ge + s * F, proj_w + e * C * F, proj_b ? proj_b + e * C : nullptr, ye + s * C,
                      rows, F, C);
  }
}

template <typename T>
void moe_combine_forward(const T* ye, const int32_t* route, const T* probs, T* out, int64_t N,
                         int64_t C, int64_t E, int64_t k, const float* bias) {
  MoeTopK r = moe_top_k(probs, N, E, k, bias);
  std::vector<int64_t> pos = route_positions(route, N * k);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * C;
    std::fill(o, o + C, T(0));
    for (int64_t j = 0; j < k; ++j) {
      int64_t p = pos[size_t(n * k + j)];
      if (p < 0) continue;
      T w = T(r.weight[size_t(n * k + j)]);
      for (int64_t ch = 0; ch < C; ++ch) o[ch] += w * ye[p * C + ch];
    }
  }
}

template <typename T>
void moe_combine_backward(const T* dout, const T* ye, const int32_t* route, const T* probs, T* dye,
                          T* dprobs, double balance_scale, int64_t N, int64_t C, int64_t E,
                          int64_t k, const float* bias, const double* shares) {
  MoeTopK r = moe_top_k(probs, N, E, k, bias);
  const int64_t A = N * k, kept = moe_route_kept(route, A);
  std::vector<double> dw(size_t(A), 0.0);
  // d(expert output) = w * dout; d(weight) = dout . ye.
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < kept; ++p) {
    int64_t nj = route[2 * p], n = nj / k;
    T w = T(r.weight[size_t(nj)]);
    double dot = 0;
    for (int64_t ch = 0; ch < C; ++ch) {
      dye[p * C + ch] = w * dout[n * C + ch];
      dot += double(dout[n * C + ch]) * double(ye[p * C + ch]);
    }
    dw[size_t(nj)] = dot;
  }
  std::fill(dye + kept * C, dye + A * C, T(0));
  // Through the renormalisation w_j = p_j / S, and the balance loss
  // d(aux)/d(p[n,e]) = E f_e / N scaled by aux_coef and the loss scale.
  std::vector<double> f(size_t(E), 0.0);
  if (shares)
    std::copy(shares, shares + E, f.begin());
  else
    for (int64_t q = 0; q < A; ++q) f[size_t(r.expert[size_t(q)])] += 1.0 / double(A);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e)
      dprobs[n * E + e] = T(balance_scale * double(E) * f[size_t(e)] / double(N));
    double wdw = 0;
    for (int64_t j = 0; j < k; ++j) wdw += r.weight[size_t(n * k + j)] * dw[size_t(n * k + j)];
    for (int64_t j = 0; j < k; ++j)
      dprobs[n * E + r.expert[size_t(n * k + j)]] += T((dw[size_t(n * k + j)] - wdw) / r.sum[size_t(n)]);
  }
}

template <typename T>
void moe_experts_backward(const T* dye, const T* xe, const T* he, const T* fc_w, const T* proj_w,
                          T* dxe, std::type_identity_t<T>* dfc_w, std::type_identity_t<T>* dfc_b,
                          std::type_identity_t<T>* dproj_w, std::type_identity_t<T>* dproj_b, T* ge,
                          T* dge, T* dhe, const int64_t* seg_expert, const int64_t* seg_rows,
                          int64_t segments, int64_t C, int64_t F) {
  int64_t s = 0;
  for (int64_t i = 0; i < segments; s += seg_rows[i], ++i) {
    const int64_t rows = seg_rows[i], e = seg_expert[i];
    if (rows == 0) continue;
    gelu_forward<T>(he + s * F, ge + s * F, rows * F);
    linear_backward<T>(dye + s * C, ge + s * F, proj_w + e * C * F, dge + s * F, false,
                       dproj_w ? dproj_w + e * C * F : nullptr, dproj_b ? dproj_b + e * C : nullptr,
                       rows, F, C);
    gelu_backward<T>(dge + s * F, he + s * F, dhe + s * F, false, rows * F);
    linear_backward<T>(dhe + s * F, xe + s * C, fc_w + e * F * C, dxe + s * C, false,
                       dfc_w ? dfc_w + e * F * C : nullptr, dfc_b ? dfc_b + e * F : nullptr, rows, C,
                       F);
  }
}

template <typename T>
void moe_route_backward(const T* dxe, const T* dprobs, const T* y, const T* router, const T* probs,
                        const int32_t* route, T* dy, bool accumulate_dy, T* drouter, T* dlogits,
                        int64_t N, int64_t C, int64_t E, int64_t k) {
  std::vector<int64_t> pos = route_positions(route, N * k);
  // dy from the experts, per token in slot order.
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* o = dy + n * C;
    if (!accumulate_dy) std::fill(o, o + C, T(0));
    for (int64_t j = 0; j < k; ++j) {
      int64_t p = pos[size_t(n * k + j)];
      if (p < 0) continue;
      for (int64_t ch = 0; ch < C; ++ch) o[ch] += dxe[p * C + ch];
    }
  }
  softmax_backward<T>(dprobs, probs, dlogits, false, N, E);
  linear_backward<T>(dlogits, y, router, dy, true, drouter, nullptr, N, C, E);
}

#define WEFT_MOE_INSTANTIATE(T)                                                                    \
  template MoeTopK moe_top_k<T>(const T*, int64_t, int64_t, int64_t, const float*);                \
  template double moe_route_forward<T>(const T*, const T*, T*, T*, int32_t*, T*, int64_t, int64_t, \
                                       int64_t, int64_t, double, const float*, double*, double*);  \
  template void moe_experts_forward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,   \
                                       T*, const int64_t*, const int64_t*, int64_t, int64_t,       \
                                       int64_t);                                                   \
  template void moe_combine_forward<T>(const T*, const int32_t*, const T*, T*, int64_t, int64_t,   \
                                       int64_t, int64_t, const float*);                            \
  template void moe_combine_backward<T>(const T*, const T*, const int32_t*, const T*, T*, T*,      \
                                        double, int64_t, int64_t, int64_t, int64_t, const float*,  \
                                        const double*);                                            \
  template void moe_experts_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,  \
                                        T*, T*, T*, T*, T*, T*, const int64_t*, const int64_t*,    \
                                        int64_t, int64_t, int64_t);                                \
  template void moe_route_backward<T>(const T*, const T*, const T*, const T*, const T*,            \
                                      const int32_t*, T*, bool, T*, T*, int64_t, int64_t, int64_t, \
                                      int64_t);
WEFT_MOE_INSTANTIATE(float)
WEFT_MOE_INSTANTIATE(double)
#undef WEFT_MOE_INSTANTIATE

}  // namespace weft::core::cpu
