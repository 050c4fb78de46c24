// The mixture-of-experts layer as one fused op (router, top-k, dispatch, expert MLPs,
// weighted combine, Switch-style balance loss) and its backward. Experts are stacked
// (E, ...) so that expert parallelism is a split of dim e. The op chains the stage kernels
// of core/cpu/moe.h, which the expert-parallel parts (op_parts_moe.cc) run apart.
//
// Shapes: N tokens (B*T), C channels, F = mlp_ratio*C, E experts, k = top_k,
// A = N*k assignments. Saved routing state: route (A,2) i32 rows (token*k + slot,
// expert) sorted by expert then token, padded with -1 after the kept assignments;
// xe (A,C) the dispatched inputs, he (A,F) the fc outputs before GELU, ye (A,C) the
// expert outputs before weighting.
#include <algorithm>

#include "base/check.h"
#include "core/cpu/moe.h"
#include "core/graph/moe_balance.h"
#include "core/graph/op_impls.h"

namespace weft::core::ops {
namespace {

// One segment per expert over the kept rows of a route sorted by expert.
void expert_segments(const int32_t* route, int64_t A, int64_t E, std::vector<int64_t>* experts,
                     std::vector<int64_t>* rows) {
  experts->resize(size_t(E));
  rows->assign(size_t(E), 0);
  for (int64_t e = 0; e < E; ++e) (*experts)[size_t(e)] = e;
  for (int64_t p = 0; p < A && route[2 * p] >= 0; ++p) ++(*rows)[size_t(route[2 * p + 1])];
}

Tensor scratch(OpContext& c, int64_t rows, int64_t cols) {
  return Tensor::empty({std::max<int64_t>(rows, 1), cols}, c.in[0]->dtype(), c.workspace,
                       memory::Tag::kWorkspace);
}

template <typename F>
void moe_forward(OpContext& c) {
  const Tensor& y = *c.in[0];
  int64_t C = y.size(-1), N = y.numel() / C, E = c.in[1]->size(0), Fd = c.in[2]->size(1);
  int64_t k = c.op.attrs.i("top_k"), A = N * k;
  int32_t* route = c.out[3]->data<int32_t>();
  Tensor logits = scratch(c, N, E), ge = scratch(c, A, Fd);
  const MoeRoutingInputs bal = moe_routing_inputs(c.scalars.moe_balance, c.op.layer, false);
  std::vector<double> counts(static_cast<size_t>(E)), sums(static_cast<size_t>(E));
  double aux = cpu::moe_route_forward<F>(y.data<F>(), c.in[1]->data<F>(), logits.data<F>(),
                                         c.out[2]->data<F>(), route, c.out[4]->data<F>(), N, C, E, k,
                                         c.op.attrs.f("capacity_factor"), bal.bias, counts.data(),
                                         sums.data());
  if (c.scalars.moe_balance && c.scalars.record_routing)
    c.scalars.moe_balance->record(c.op.layer, counts.data(), sums.data(), double(N));
  c.out[1]->fill_(bal.balance_loss ? aux : 0.0);
  std::vector<int64_t> seg_e, seg_r;
  expert_segments(route, A, E, &seg_e, &seg_r);
  cpu::moe_experts_forward<F>(c.out[4]->data<F>(), c.in[2]->data<F>(), c.in[3]->data<F>(),
                              c.in[4]->data<F>(), c.in[5]->data<F>(), c.out[5]->data<F>(), ge.data<F>(),
                              c.out[6]->data<F>(), seg_e.data(), seg_r.data(), E, C, Fd);
  cpu::moe_combine_forward<F>(c.out[6]->data<F>(), route, c.out[2]->data<F>(), c.out[0]->data<F>(), N, C,
                              E, k, bal.bias);
}

template <typename F>
void moe_backward(OpContext& c) {
  const Tensor& dout = *c.in[0];
  int64_t C = dout.size(-1), N = dout.numel() / C, E = c.in[2]->size(0), Fd = c.in[3]->size(1);
  int64_t k = c.op.attrs.i("top_k"), A = N * k;
  WEFT_CHECK(c.out.size() == 6, "moe.bwd expects all six gradients");
  const F* probs = c.in[7]->data<F>();
  const int32_t* route = c.in[8]->data<int32_t>();
  Tensor dye = scratch(c, A, C), dprobs = scratch(c, N, E), dxe = scratch(c, A, C);
  Tensor ge = scratch(c, A, Fd), dge = scratch(c, A, Fd), dhe = scratch(c, A, Fd);
  const MoeRoutingInputs bal = moe_routing_inputs(c.scalars.moe_balance, c.op.layer, true);
  const double balance_scale = bal.balance_loss ? c.op.attrs.f("aux_coef") * c.scalars.loss_scale : 0.0;
  cpu::moe_combine_backward<F>(dout.data<F>(), c.in[11]->data<F>(), route, probs, dye.data<F>(),
                               dprobs.data<F>(), balance_scale, N, C, E, k, bal.bias, bal.shares);
  std::vector<int64_t> seg_e, seg_r;
  expert_segments(route, A, E, &seg_e, &seg_r);
  cpu::moe_experts_backward<F>(dye.data<F>(), c.in[9]->data<F>(), c.in[10]->data<F>(), c.in[3]->data<F>(),
                               c.in[5]->data<F>(), dxe.data<F>(), c.out[2]->data<F>(), c.out[3]->data<F>(),
                               c.out[4]->data<F>(), c.out[5]->data<F>(), ge.data<F>(), dge.data<F>(),
                               dhe.data<F>(), seg_e.data(), seg_r.data(), E, C, Fd);
  Tensor dlogits = scratch(c, N, E);
  cpu::moe_route_backward<F>(dxe.data<F>(), dprobs.data<F>(), c.in[1]->data<F>(), c.in[2]->data<F>(), probs,
                             route, c.out[0]->data<F>(), c.accumulate(0), c.out[1]->data<F>(),
                             dlogits.data<F>(), N, C, E, k);
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
