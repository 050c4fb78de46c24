// The mixture-of-experts layer as one fused op (router, top-k, dispatch, expert MLPs,
// weighted combine, Switch-style balance loss) and its backward. Experts are stacked
// (E, ...) so that expert parallelism is a split of dim e.
//
// Shapes: N tokens (B*T), C channels, F = mlp_ratio*C, E experts, k = top_k,
// A = N*k assignments. Saved routing state: route (A,2) i32 rows (token*k + slot,
// expert) sorted by expert then token, padded with -1 after the kept assignments;
// xe (A,C) the dispatched inputs, he (A,F) the fc outputs before GELU, ye (A,C) the
// expert outputs before weighting.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/graph/op_impls.h"

namespace weft::core::ops {
namespace {

struct Routing {
  int64_t N, E, k;
  std::vector<int32_t> top_e;  // (N,k) chosen experts, by descending probability
  std::vector<double> top_w;   // (N,k) renormalised weights
  std::vector<double> top_sum; // (N) sum of the chosen probabilities
  std::vector<int64_t> pos;    // (N*k) position in route, -1 when dropped
};

// Top-k per token with ties broken by the lower expert index, as torch.topk does on CPU.
template <typename F>
Routing route_tokens(const F* probs, int64_t N, int64_t E, int64_t k) {
  Routing r{N, E, k, std::vector<int32_t>(N * k), std::vector<double>(N * k),
            std::vector<double>(N), std::vector<int64_t>(N * k, -1)};
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const F* p = probs + n * E;
    std::vector<int32_t> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += double(p[idx[j]]);
    r.top_sum[n] = s;
    for (int64_t j = 0; j < k; ++j) {
      r.top_e[n * k + j] = idx[j];
      r.top_w[n * k + j] = double(p[idx[j]]) / s;
    }
  }
  return r;
}

// Capacity per expert: unlimited for capacity_factor 0, else ceil(cf * N * k / E).
int64_t expert_capacity(double cf, int64_t N, int64_t k, int64_t E) {
  return cf <= 0 ? N * k : int64_t(std::ceil(cf * double(N * k) / double(E)));
}

template <typename F>
void moe_forward(OpContext& c) {
  const Tensor& y = *c.in[0];
  const F* Wr = c.in[1]->data<F>();
  const F *fcw = c.in[2]->data<F>(), *fcb = c.in[3]->data<F>();
  const F *pw = c.in[4]->data<F>(), *pb = c.in[5]->data<F>();
  int64_t C = y.size(-1), N = y.numel() / C, E = c.in[1]->size(0), Fd = c.in[2]->size(1);
  int64_t k = c.op.attrs.i("top_k");
  F* out = c.out[0]->data<F>();
  F* probs = c.out[2]->data<F>();
  int32_t* route = c.out[3]->data<int32_t>();
  F *xe = c.out[4]->data<F>(), *he = c.out[5]->data<F>(), *ye = c.out[6]->data<F>();
  const F* yd = y.data<F>();

  // Router: probs = softmax(y Wr^T).
  Tensor logits = Tensor::empty({N, E}, y.dtype(), c.workspace, memory::Tag::kWorkspace);
  cpu::linear_forward<F>(yd, Wr, nullptr, logits.data<F>(), N, C, E);
  cpu::softmax_forward<F>(logits.data<F>(), probs, N, E);
  Routing r = route_tokens(probs, N, E, k);

  // Balance loss E * sum_e f_e P_e over this micro-batch (f counted before dropping).
  std::vector<double> f(E, 0.0), P(E, 0.0);
  for (int64_t a = 0; a < N * k; ++a) f[r.top_e[a]] += 1.0 / double(N * k);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) P[e] += double(probs[n * E + e]) / double(N);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += f[e] * P[e];
  c.out[1]->fill_(double(E) * aux);

  // Dispatch: by expert, then token order; the first `cap` assignments of an expert stay.
  int64_t cap = expert_capacity(c.op.attrs.f("capacity_factor"), N, k, E);
  std::vector<int64_t> begin(E + 1, 0);
  int64_t a = 0;
  for (int64_t e = 0; e < E; ++e) {
    begin[e] = a;
    int64_t taken = 0;
    for (int64_t n = 0; n < N && taken < cap; ++n)
      for (int64_t j = 0; j < k; ++j)
        if (r.top_e[n * k + j] == e && taken < cap) {
          route[2 * a] = int32_t(n * k + j);
          route[2 * a + 1] = int32_t(e);
          ++a, ++taken;
        }
  }
  begin[E] = a;
  for (int64_t p = a; p < N * k; ++p) route[2 * p] = route[2 * p + 1] = -1;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < a; ++p)
    std::copy(yd + (route[2 * p] / k) * C, yd + (route[2 * p] / k + 1) * C, xe + p * C);

  // Expert MLPs on their contiguous segments.
  Tensor ge = Tensor::empty({std::max<int64_t>(a, 1), Fd}, y.dtype(), c.workspace,
                            memory::Tag::kWorkspace);
  for (int64_t e = 0; e < E; ++e) {
    int64_t rows = begin[e + 1] - begin[e], s = begin[e];
    if (rows == 0) continue;
    cpu::linear_forward<F>(xe + s * C, fcw + e * Fd * C, fcb + e * Fd, he + s * Fd, rows, C, Fd);
    cpu::gelu_forward<F>(he + s * Fd, ge.data<F>() + s * Fd, rows * Fd);
    cpu::linear_forward<F>(ge.data<F>() + s * Fd, pw + e * C * Fd, pb + e * C, ye + s * C, rows,
                           Fd, C);
  }

  // Combine per token in slot order, so the sum order never depends on the dispatch.
  std::vector<int64_t> pos(N * k, -1);
  for (int64_t p = 0; p < a; ++p) pos[route[2 * p]] = p;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    F* o = out + n * C;
    std::fill(o, o + C, F(0));
    for (int64_t j = 0; j < k; ++j) {
      int64_t p = pos[n * k + j];
      if (p < 0) continue;
      F w = F(r.top_w[n * k + j]);
      for (int64_t ch = 0; ch < C; ++ch) o[ch] += w * ye[p * C + ch];
    }
  }
}

template <typename F>
void moe_backward(OpContext& c) {
  const Tensor& dout_t = *c.in[0];
  const F *dout = dout_t.data<F>(), *yd = c.in[1]->data<F>(), *Wr = c.in[2]->data<F>();
  const F *fcw = c.in[3]->data<F>(), *pw = c.in[5]->data<F>();
  const F* probs = c.in[7]->data<F>();
  const int32_t* route = c.in[8]->data<int32_t>();
  const F *xe = c.in[9]->data<F>(), *he = c.in[10]->data<F>(), *ye = c.in[11]->data<F>();
  int64_t C = dout_t.size(-1), N = dout_t.numel() / C, E = c.in[2]->size(0);
  int64_t Fd = c.in[3]->size(1), k = c.op.attrs.i("top_k");
  WEFT_CHECK(c.out.size() == 6, "moe.bwd expects all six gradients");
  F* dy = c.out[0]->data<F>();
  F *dWr = c.out[1]->data<F>(), *dfcw = c.out[2]->data<F>(), *dfcb = c.out[3]->data<F>();
  F *dpw = c.out[4]->data<F>(), *dpb = c.out[5]->data<F>();

  Routing r = route_tokens(probs, N, E, k);
  int64_t a = 0;
  while (a < N * k && route[2 * a] >= 0) ++a;
  std::vector<int64_t> pos(N * k, -1), begin(E + 1, a);
  for (int64_t p = a - 1; p >= 0; --p) {
    pos[route[2 * p]] = p;
    begin[route[2 * p + 1]] = p;
  }
  for (int64_t e = E - 1; e >= 0; --e) begin[e] = std::min(begin[e], begin[e + 1]);

  // d(expert output) = w * dout; d(weight) = dout . ye.
  auto ws = [&](int64_t cols) {
    return Tensor::empty({std::max<int64_t>(a, 1), cols}, dout_t.dtype(), c.workspace,
                         memory::Tag::kWorkspace);
  };
  Tensor dye = ws(C), ge = ws(Fd), dge = ws(Fd), dhe = ws(Fd), dxe = ws(C);
  std::vector<double> dw(N * k, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < a; ++p) {
    int64_t nj = route[2 * p], n = nj / k;
    F w = F(r.top_w[nj]);
    double dot = 0;
    for (int64_t ch = 0; ch < C; ++ch) {
      dye.data<F>()[p * C + ch] = w * dout[n * C + ch];
      dot += double(dout[n * C + ch]) * double(ye[p * C + ch]);
    }
    dw[nj] = dot;
  }

  // Expert MLPs backward, segment by segment (parameter gradients accumulate).
  for (int64_t e = 0; e < E; ++e) {
    int64_t rows = begin[e + 1] - begin[e], s = begin[e];
    if (rows == 0) continue;
    cpu::gelu_forward<F>(he + s * Fd, ge.data<F>() + s * Fd, rows * Fd);
    cpu::linear_backward<F>(dye.data<F>() + s * C, ge.data<F>() + s * Fd, pw + e * C * Fd,
                            dge.data<F>() + s * Fd, false, dpw + e * C * Fd, dpb + e * C, rows, Fd,
                            C);
    cpu::gelu_backward<F>(dge.data<F>() + s * Fd, he + s * Fd, dhe.data<F>() + s * Fd, false,
                          rows * Fd);
    cpu::linear_backward<F>(dhe.data<F>() + s * Fd, xe + s * C, fcw + e * Fd * C,
                            dxe.data<F>() + s * C, false, dfcw + e * Fd * C, dfcb + e * Fd, rows, C,
                            Fd);
  }

  // dy from the experts, per token in slot order.
  bool acc = c.accumulate(0);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    F* o = dy + n * C;
    if (!acc) std::fill(o, o + C, F(0));
    for (int64_t j = 0; j < k; ++j) {
      int64_t p = pos[n * k + j];
      if (p < 0) continue;
      for (int64_t ch = 0; ch < C; ++ch) o[ch] += dxe.data<F>()[p * C + ch];
    }
  }

  // Router: through the renormalisation w_j = p_j / S and the balance loss
  // d(aux)/d(p[n,e]) = E f_e / N, scaled by aux_coef and the loss scale.
  std::vector<double> f(E, 0.0);
  for (int64_t q = 0; q < N * k; ++q) f[r.top_e[q]] += 1.0 / double(N * k);
  double aux_scale = c.op.attrs.f("aux_coef") * c.scalars.loss_scale;
  Tensor dp = Tensor::empty({N, E}, dout_t.dtype(), c.workspace, memory::Tag::kWorkspace);
  F* dpp = dp.data<F>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e) dpp[n * E + e] = F(aux_scale * double(E) * f[e] / double(N));
    double wdw = 0;
    for (int64_t j = 0; j < k; ++j) wdw += r.top_w[n * k + j] * dw[n * k + j];
    for (int64_t j = 0; j < k; ++j)
      dpp[n * E + r.top_e[n * k + j]] += F((dw[n * k + j] - wdw) / r.top_sum[n]);
  }
  Tensor dlogits = Tensor::empty({N, E}, dout_t.dtype(), c.workspace, memory::Tag::kWorkspace);
  cpu::softmax_backward<F>(dpp, probs, dlogits.data<F>(), false, N, E);
  cpu::linear_backward<F>(dlogits.data<F>(), yd, Wr, dy, true, dWr, nullptr, N, C, E);
}

}  // namespace

void run_moe(OpContext& c) {
  if (c.in[0]->dtype() == DType::kF64) moe_forward<double>(c);
  else moe_forward<float>(c);
}
void run_moe_bwd(OpContext& c) {
  if (c.in[0]->dtype() == DType::kF64) moe_backward<double>(c);
  else moe_backward<float>(c);
}

void bwd_moe(Autodiff& ad, const Op& f) {
  Attrs a = f.attrs;
  std::vector<int> ins = {ad.grad(f.outputs[0])};
  ins.insert(ins.end(), f.inputs.begin(), f.inputs.end());
  ins.insert(ins.end(), f.outputs.begin() + 2, f.outputs.end());
  ad.emit(f, "moe.bwd", ins, f.inputs, a);
}

}  // namespace weft::core::ops
