// MoE on local pieces through the stage kernels of core/cpu/moe.h: the whole op (also on a
// slice of the experts' hidden units, where the output bias is missing on all but one
// part) and the expert-parallel parts moe.route, moe.experts and moe.combine, forward and
// backward, with the operands planner/lower_custom.cc gives them.
#include <algorithm>
#include <numeric>

#include "base/check.h"
#include "base/error.h"
#include "core/cpu/moe.h"
#include "core/graph/moe_balance.h"
#include "core/graph/op_parts.h"

namespace weft::core::parts_detail {
namespace {

Tensor ws(const PartContext& ctx, const Shape& s, DType dt) {
  Shape z = s;
  for (int64_t& d : z) d = std::max<int64_t>(d, 1);  // kernels may index a 0-row scratch's base
  return Tensor::empty(z, dt, ctx.workspace, memory::Tag::kWorkspace);
}

const Tensor& need(const Operands& ops, const Op& op, int slot) {
  const Tensor* t = ops.in(slot);
  WEFT_CHECK(t, op.type, ": input slot ", slot, " is missing");
  return *t;
}

template <typename F>
const F* ptr_or_null(const Tensor* t) {
  return t ? t->data<F>() : nullptr;
}

// Segments of the expert-side rows: one per (source, local expert), source-major.
int64_t segments_from_ctx(const PartContext& ctx, int64_t experts_local, int64_t rows, std::vector<int64_t>* se,
                          std::vector<int64_t>* sr) {
  const auto& er = ctx.expert_rows;
  WEFT_CHECK(!er.empty() && er.size() % size_t(experts_local) == 0, ctx.op.type, " ", ctx.part,
             ": expert_rows must give rows per (source, local expert) for ", experts_local,
             " local experts, got ", er.size(), " counts");
  int64_t total = 0;
  for (size_t i = 0; i < er.size(); ++i) {
    WEFT_CHECK(er[i] >= 0, "negative expert_rows entry");
    se->push_back(int64_t(i) % experts_local);
    sr->push_back(er[i]);
    total += er[i];
  }
  WEFT_CHECK(total <= rows, ctx.op.type, " ", ctx.part, ": expert_rows add up to ", total, " but only ", rows,
             " rows arrived");
  return total;
}

// One segment per expert over a route's kept rows (everything on one device).
int64_t segments_from_route(const Tensor& route, int64_t E, std::vector<int64_t>* se, std::vector<int64_t>* sr) {
  std::vector<int64_t> counts = moe_expert_counts(route, E);
  se->resize(size_t(E));
  std::iota(se->begin(), se->end(), int64_t(0));
  *sr = counts;
  return std::accumulate(counts.begin(), counts.end(), int64_t(0));
}

template <typename F>
void zero_rows(Tensor& t, int64_t from) {
  const int64_t cols = t.numel() / std::max<int64_t>(t.size(0), 1);
  std::fill(t.data<F>() + from * cols, t.data<F>() + t.numel(), F(0));
}

// The balance-loss gradient joins on the part whose expert outputs are addend 0, so that
// the partial sums over a hidden-unit split count it once.
// Under loss_free there is no balance loss.
double balance_scale(const PartContext& ctx, const Operands& ops, const MoeRoutingInputs& bal) {
  const LocalOperand* ye = ops.in_desc(11);
  WEFT_CHECK(ye, "moe.bwd: input slot 11 (ye) is missing");
  return ye->split_index == 0 && bal.balance_loss ? ctx.op.attrs.f("aux_coef") * ctx.scalars.loss_scale
                                                  : 0.0;
}

MoeRoutingInputs balance_inputs(const PartContext& ctx) {
  return moe_routing_inputs(ctx.scalars.moe_balance, ctx.op.layer, ctx.op.type == "moe.bwd");
}

// ---- forward ---------------------------------------------------------------------------

template <typename F>
void route_fwd(PartContext& ctx, Operands& ops) {
  const Op& op = ctx.op;
  const Tensor &y = need(ops, op, 0), &router = need(ops, op, 1);
  const int64_t C = y.size(-1), N = y.numel() / C, E = router.size(0), k = op.attrs.i("top_k"), A = N * k;
  Tensor logits = ws(ctx, {N, E}, y.dtype());
  Tensor &probs = ops.out(2, {N, E}), &route = ops.out(3, {A, 2}), &xe = ops.out(4, {A, C});
  const MoeRoutingInputs bal = balance_inputs(ctx);
  std::vector<double> counts(static_cast<size_t>(E)), sums(static_cast<size_t>(E));
  double aux = cpu::moe_route_forward<F>(y.data<F>(), router.data<F>(), logits.data<F>(), probs.data<F>(),
                                         route.data<int32_t>(), xe.data<F>(), N, C, E, k,
                                         op.attrs.f("capacity_factor"), bal.bias, counts.data(), sums.data());
  if (ctx.scalars.moe_balance && ctx.scalars.record_routing)
    ctx.scalars.moe_balance->record(op.layer, counts.data(), sums.data(), double(N));
  zero_rows<F>(xe, cpu::moe_route_kept(route.data<int32_t>(), A));
  ops.out(1, {1}).fill_(bal.balance_loss ? aux : 0.0);
}

template <typename F>
void experts_fwd(PartContext& ctx, Operands& ops, const Tensor& xe, const std::vector<int64_t>& se,
                 const std::vector<int64_t>& sr, int64_t used, Tensor& he, Tensor& ye) {
  const Op& op = ctx.op;
  const Tensor &fcw = need(ops, op, 2), &pw = need(ops, op, 4);
  const int64_t C = xe.size(1), Fl = fcw.size(1), R = xe.size(0);
  WEFT_CHECK(fcw.size(2) == C && pw.size(2) == Fl, "moe experts: weights ", shape_str(fcw.shape()), " and ",
             shape_str(pw.shape()), " do not fit rows of width ", C);
  Tensor ge = ws(ctx, {R, Fl}, xe.dtype());
  cpu::moe_experts_forward<F>(xe.data<F>(), fcw.data<F>(), ptr_or_null<F>(ops.in(3)), pw.data<F>(),
                              ptr_or_null<F>(ops.in(5)), he.data<F>(), ge.data<F>(), ye.data<F>(), se.data(),
                              sr.data(), int64_t(se.size()), C, Fl);
  zero_rows<F>(he, used);
  zero_rows<F>(ye, used);
}

template <typename F>
void combine_fwd(PartContext& ctx, Operands& ops, const Tensor& ye, const Tensor& route, const Tensor& probs) {
  const int64_t N = probs.size(0), E = probs.size(1), C = ye.size(1), k = ctx.op.attrs.i("top_k");
  WEFT_CHECK(ye.size(0) == N * k && route.size(0) == N * k, "moe combine: ", ye.size(0), " rows for ", N,
             " tokens x top_k ", k);
  Tensor& out = ops.out(0, {N, C});
  cpu::moe_combine_forward<F>(ye.data<F>(), route.data<int32_t>(), probs.data<F>(), out.data<F>(), N, C, E, k,
                              balance_inputs(ctx).bias);
}

template <typename F>
void forward(PartContext& ctx, Operands& ops) {
  const std::string& part = ctx.part;
  const Op& op = ctx.op;
  if (part.empty()) {
    route_fwd<F>(ctx, ops);
    const Tensor &xe = ops.out(4), &route = ops.out(3);
    std::vector<int64_t> se, sr;
    int64_t used = segments_from_route(route, need(ops, op, 1).size(0), &se, &sr);
    const int64_t A = xe.size(0), C = xe.size(1), Fl = need(ops, op, 2).size(1);
    Tensor &he = ops.out(5, {A, Fl}), &ye = ops.out(6, {A, C});
    experts_fwd<F>(ctx, ops, xe, se, sr, used, he, ye);
    combine_fwd<F>(ctx, ops, ye, route, ops.out(2));
  } else if (part == "moe.route") {
    route_fwd<F>(ctx, ops);
  } else if (part == "moe.experts") {
    const Tensor& xe = ops.scratch_in("moe.xe_local", 0);
    const int64_t R = xe.size(0), C = xe.size(1), El = need(ops, op, 2).size(0), Fl = need(ops, op, 2).size(1);
    std::vector<int64_t> se, sr;
    int64_t used = segments_from_ctx(ctx, El, R, &se, &sr);
    Tensor& he = ops.scratch_out("moe.he_local", 0, {R, Fl});
    Tensor& ye = ops.scratch_out("moe.ye_local", 1, {R, C});
    experts_fwd<F>(ctx, ops, xe, se, sr, used, he, ye);
  } else if (part == "moe.combine") {
    combine_fwd<F>(ctx, ops, need(ops, op, 6), need(ops, op, 3), need(ops, op, 2));
  } else {
    throw NotSupported("no CPU part '" + part + "' for op moe");
  }
}

// ---- backward --------------------------------------------------------------------------

template <typename F>
void combine_bwd(PartContext& ctx, Operands& ops, Tensor& dye, Tensor& dprobs) {
  const Op& op = ctx.op;
  const Tensor &dout = need(ops, op, 0), &ye = need(ops, op, 11), &route = need(ops, op, 8);
  const Tensor& probs = need(ops, op, 7);
  const int64_t N = probs.size(0), E = probs.size(1), C = dout.size(-1), k = op.attrs.i("top_k");
  WEFT_CHECK(dout.numel() == N * C && ye.size(0) == N * k, "moe.bwd combine: shapes ", shape_str(dout.shape()),
             " ", shape_str(ye.shape()), " for ", N, " tokens");
  const MoeRoutingInputs bal = balance_inputs(ctx);
  cpu::moe_combine_backward<F>(dout.data<F>(), ye.data<F>(), route.data<int32_t>(), probs.data<F>(), dye.data<F>(),
                               dprobs.data<F>(), balance_scale(ctx, ops, bal), N, C, E, k, bal.bias, bal.shares);
}

template <typename F>
void experts_bwd(PartContext& ctx, Operands& ops, const Tensor& dye, const Tensor& xe, const Tensor& he,
                 const std::vector<int64_t>& se, const std::vector<int64_t>& sr, int64_t used, Tensor& dxe) {
  const Op& op = ctx.op;
  const Tensor &fcw = need(ops, op, 3), &pw = need(ops, op, 5);
  const int64_t R = xe.size(0), C = xe.size(1), Fl = fcw.size(1);
  WEFT_CHECK(dye.size(0) >= used && he.size(0) >= used && he.size(1) == Fl, "moe.bwd experts: rows ",
             shape_str(dye.shape()), " ", shape_str(he.shape()), " for ", used, " routed rows");
  Tensor &dfcw = ops.out(2, fcw.shape(), true), &dfcb = ops.out(3, {fcw.size(0), Fl}, true);
  Tensor &dpw = ops.out(4, pw.shape(), true), &dpb = ops.out(5, {pw.size(0), C}, true);
  Tensor ge = ws(ctx, {R, Fl}, xe.dtype()), dge = ws(ctx, {R, Fl}, xe.dtype()), dhe = ws(ctx, {R, Fl}, xe.dtype());
  cpu::moe_experts_backward<F>(dye.data<F>(), xe.data<F>(), he.data<F>(), fcw.data<F>(), pw.data<F>(), dxe.data<F>(),
                               dfcw.data<F>(), dfcb.data<F>(), dpw.data<F>(), dpb.data<F>(), ge.data<F>(),
                               dge.data<F>(), dhe.data<F>(), se.data(), sr.data(), int64_t(se.size()), C, Fl);
  zero_rows<F>(dxe, used);
}

template <typename F>
void route_bwd(PartContext& ctx, Operands& ops, const Tensor& dxe, const Tensor& dprobs) {
  const Op& op = ctx.op;
  const Tensor &y = need(ops, op, 1), &router = need(ops, op, 2), &probs = need(ops, op, 7);
  const Tensor& route = need(ops, op, 8);
  const int64_t C = y.size(-1), N = y.numel() / C, E = router.size(0), k = op.attrs.i("top_k");
  WEFT_CHECK(probs.size(0) == N && dxe.size(0) == N * k && dprobs.numel() == N * E, "moe.bwd route: shapes ",
             shape_str(dxe.shape()), " ", shape_str(dprobs.shape()), " for ", N, " tokens");
  Tensor& dy = ops.out(0, y.shape());
  Tensor& drouter = ops.out(1, router.shape(), true);
  Tensor dlogits = ws(ctx, {N, E}, y.dtype());
  cpu::moe_route_backward<F>(dxe.data<F>(), dprobs.data<F>(), y.data<F>(), router.data<F>(), probs.data<F>(),
                             route.data<int32_t>(), dy.data<F>(), ops.accumulate(0), drouter.data<F>(),
                             dlogits.data<F>(), N, C, E, k);
}

template <typename F>
void backward(PartContext& ctx, Operands& ops) {
  const std::string& part = ctx.part;
  const Op& op = ctx.op;
  if (part.empty()) {
    WEFT_CHECK(op.outputs.size() == 6, "moe.bwd expects all six gradients");
    const Tensor& probs = need(ops, op, 7);
    const Tensor &xe = need(ops, op, 9), &he = need(ops, op, 10), &route = need(ops, op, 8);
    const int64_t A = xe.size(0), C = xe.size(1);
    Tensor dye = ws(ctx, {A, C}, xe.dtype()), dprobs = ws(ctx, probs.shape(), xe.dtype());
    Tensor dxe = ws(ctx, {A, C}, xe.dtype());
    combine_bwd<F>(ctx, ops, dye, dprobs);
    std::vector<int64_t> se, sr;
    int64_t used = segments_from_route(route, need(ops, op, 2).size(0), &se, &sr);
    experts_bwd<F>(ctx, ops, dye, xe, he, se, sr, used, dxe);
    route_bwd<F>(ctx, ops, dxe, dprobs);
  } else if (part == "moe.combine") {
    const Tensor &ye = need(ops, op, 11), &probs = need(ops, op, 7);
    Tensor& dye = ops.scratch_out("moe.dye", 0, ye.shape());
    Tensor& dprobs = ops.scratch_out("moe.dprobs", 1, probs.shape());
    combine_bwd<F>(ctx, ops, dye, dprobs);
  } else if (part == "moe.experts") {
    const Tensor& dye = ops.scratch_in("moe.dye_local", 0);
    const Tensor &xe = ops.scratch_in("moe.xe_local", 1), &he = ops.scratch_in("moe.he_local", 2);
    std::vector<int64_t> se, sr;
    int64_t used = segments_from_ctx(ctx, need(ops, op, 3).size(0), xe.size(0), &se, &sr);
    Tensor& dxe = ops.scratch_out("moe.dxe_local", 0, xe.shape());
    experts_bwd<F>(ctx, ops, dye, xe, he, se, sr, used, dxe);
  } else if (part == "moe.route") {
    route_bwd<F>(ctx, ops, ops.scratch_in("moe.dxe", 0), ops.scratch_in("moe.dprobs", 1));
  } else {
    throw NotSupported("no CPU part '" + part + "' for op moe.bwd");
  }
}

}  // namespace

void run_moe(PartContext& ctx, Operands& ops) {
  const bool fwd = ctx.op.type == "moe";
  const Tensor* x = ops.in(fwd ? 1 : 2);  // the router weight: present in every part
  WEFT_CHECK(x || ctx.part == "moe.experts" || ctx.part == "moe.combine", ctx.op.type, " ", ctx.part,
             ": router weight missing");
  const Tensor& probe = x ? *x : *ops.all_inputs().at(0);
  if (probe.dtype() == DType::kF64) fwd ? forward<double>(ctx, ops) : backward<double>(ctx, ops);
  else if (probe.dtype() == DType::kF32) fwd ? forward<float>(ctx, ops) : backward<float>(ctx, ops);
  else throw NotSupported(std::string("CPU moe on dtype ") + dtype_name(probe.dtype()));
}

}  // namespace weft::core::parts_detail
