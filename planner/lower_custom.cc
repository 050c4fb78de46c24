// Custom lowerings of two ops into parts, with edges between the parts whose communication
// phase 3 derives: vocab-parallel cross-entropy (each lane's row max and sums declared as
// V-max and V-sum values: Megatron's max and sum all-reduces over the tensor-parallel lanes)
// and expert-parallel MoE (each lane's routed rows and the rows its experts take, as two
// layouts of a ragged row dim within the ep team: the dispatch and return all_to_all_v).
//
// Parts the executor runs (operands by op slot; scratch operands by name):
//   ce.max     logits -> ce.max (b,t) local max over the vocabulary slice
//   ce.sumexp  logits, targets, ce.max -> ce.sums (2,b,t): sum of exp(logit - max) over the
//              slice, and the target's logit when the target falls in the slice (else 0)
//   ce.finish  logits, targets, ce.max, ce.sums -> loss (whole), probs (slice)
//   moe.route    y, router -> aux, probs, route, xe (this slice's assignments, grouped by
//                the lane of their expert: the all_to_all_v send buffer)
//   moe.experts  moe.xe_local, expert weights -> moe.he_local, moe.ye_local
//   moe.combine  ye, route, probs -> out
// and, mirrored, the backward parts of moe.bwd under the same names. Under a split of the
// experts' hidden units (tp) the expert outputs, the probability gradient and the input and
// router gradients are partial sums over the tp lanes; the balance-loss term joins on part 0
// only (the part index of the ye operand), like the output bias in the forward.
#include <algorithm>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "planner/lower_stage.h"

namespace weft::planner {
namespace {

Instr compute(int op, const std::string& part, std::vector<Operand> in, std::vector<Operand> out) {
  Instr c;
  c.kind = InstrKind::kCompute;
  c.op = op;
  c.part = part;
  c.in = std::move(in);
  c.out = std::move(out);
  return c;
}

}  // namespace

void StageBuilder::emit_ce(int op, const std::vector<SubOp>& subs, const Ctx& ctx) {
  std::vector<int> logits = inputs(op, subs, 0, ctx), targets = inputs(op, subs, 1, ctx);
  std::vector<std::vector<bool>> acc(2);
  std::vector<int> loss = outputs(op, subs, 0, ctx, &acc[0]), probs = outputs(op, subs, 1, ctx, &acc[1]);
  const int tv = g_.op(op).inputs[1];
  // The max and the sums in f64 for an f64 model (gradient checks), else f32.
  const core::DType sdt =
      g_.value(g_.op(op).inputs[0]).dtype == core::DType::kF64 ? core::DType::kF64 : core::DType::kF32;
  // A lane's row max (b,t) and sums (2,b,t) over its vocabulary slice are addend tp_i of tp
  // of the whole rows' values: combined by max, and by sum (the sum of exponentials, and the
  // target's logit, which only the lane holding the target adds). Each is an edge from that
  // layout to the whole value on every lane; phase 3 derives what joins them.
  auto scratch = [&](int l, const std::string& name, bool pair, bool whole, ReduceOp r) {
    Piece p = role(l).tensors[size_t(targets[size_t(l)])].piece;
    if (pair) p.box.insert(p.box.begin(), DimSlice{0, 2, 1, 0});
    if (!whole) p.part = plan_.mesh.lane_tp(l), p.parts = tp_, p.reduce = r;
    TensorDesc t = scratch_tensor(name, p, sdt);
    t.shift_dim = pair ? 1 : 0;
    t.shift = slice_shift(tv, 0);
    return t;
  };
  auto edge = [&](const std::string& name, bool pair, ReduceOp r) {
    Edge e;
    e.value = -1;
    e.op = op;
    e.part = name;
    for (int l = 0; l < lanes_; ++l) {
      e.devices.push_back({stage_, l});
      e.from.push_back(scratch(l, name, pair, false, r));
      e.have.push_back(add_tensor(l, e.from.back()));
      e.need.push_back(scratch(l, name, pair, true, r));
    }
    return e;
  };
  Edge mx = edge("ce.max", false, ReduceOp::kMax);
  for (int l = 0; l < lanes_; ++l)
    emit(l, compute(op, "ce.max", {{0, logits[size_t(l)]}}, {{-1, mx.have[size_t(l)]}}), ctx);
  const std::vector<int> mx_all = preserve(mx, ctx);
  Edge sums = edge("ce.sums", true, ReduceOp::kSum);
  for (int l = 0; l < lanes_; ++l)
    emit(l, compute(op, "ce.sumexp", {{0, logits[size_t(l)]}, {1, targets[size_t(l)]}, {-1, mx_all[size_t(l)]}},
                    {{-1, sums.have[size_t(l)]}}),
         ctx);
  const std::vector<int> sums_all = preserve(sums, ctx);
  for (int l = 0; l < lanes_; ++l)
    emit(l, compute(op, "ce.finish",
                    {{0, logits[size_t(l)]}, {1, targets[size_t(l)]}, {-1, mx_all[size_t(l)]}, {-1, sums_all[size_t(l)]}},
                    {{0, loss[size_t(l)]}, {1, probs[size_t(l)]}}),
         ctx);
}

// The edge of one expert-parallel exchange within each ep team, from `have` (per lane) into
// `sink`. Its rows are described in the team's own coordinates (the team's routed rows
// [0, E rows)): lane e's own rows [e rows, (e+1) rows), grouped by the lane of their expert
// in blocks of q = rows / E under uniform routing, and the rows lane u's experts take: block
// u of every lane, source-major (the strided slice {u q, q, E, rows}). Row counts are the
// ragged dim, so phase 3 joins the two layouts by all_to_all_v (to_experts: the dispatch;
// else the return) over each team; the descriptions move by E rows per data-parallel replica,
// whose teams touch nothing of each other's.
std::vector<int> StageBuilder::moe_exchange(int op, const std::string& part, bool to_experts,
                                            const std::vector<int>& have,
                                            const std::vector<int>& sink, const Ctx& ctx) {
  const int64_t E = ep_;
  Edge e;
  e.value = -1;
  e.op = op;
  e.part = part;
  e.ragged_dim = 0;
  for (int l = 0; l < lanes_; ++l) {
    // Copies, not references: preserve adds tensors to the role.
    const TensorDesc src = role(l).tensors[size_t(have[size_t(l)])];
    const TensorDesc dst = role(l).tensors[size_t(sink[size_t(l)])];
    const int64_t rows = src.piece.box[0].numel(),
                  cols = src.piece.numel() / std::max<int64_t>(rows, 1);
    if (rows % E)
      throw ConfigError("parallel.ep",
                        "ep=" + std::to_string(E) + " must divide the " + std::to_string(rows) +
                            " rows a lane routes per micro-batch (its tokens x model.moe.top_k): "
                            "each lane's rows are exchanged in ep equal blocks under uniform "
                            "routing; choose an ep that divides them, or a micro-batch or "
                            "seq_len that ep divides");
    const int64_t q = rows / E, own = plan_.mesh.lane_ep(l);
    auto team_rows = [&](const TensorDesc& like, bool expert_side) {
      TensorDesc t = like;
      t.piece.box = {expert_side ? DimSlice{own * q, q, E, rows}.normalised()
                                 : DimSlice{own * rows, rows, 1, 0},
                     DimSlice{0, cols, 1, 0}};
      t.shift_dim = 0, t.shift = E * rows, t.shift_part = 0;
      return t;
    };
    e.devices.push_back({stage_, l});
    e.from.push_back(team_rows(src, !to_experts));
    e.have.push_back(have[size_t(l)]);
    e.need.push_back(team_rows(dst, to_experts));
    e.sink.push_back({-1, sink[size_t(l)]});
  }
  return preserve(e, ctx);
}

void StageBuilder::emit_moe(int op, const std::vector<SubOp>& subs, const Ctx& ctx) {
  const core::Op& o = g_.op(op);
  std::vector<std::vector<int>> in;
  for (int s = 0; s < 6; ++s) in.push_back(inputs(op, subs, s, ctx));
  std::vector<std::vector<bool>> acc(7);
  std::vector<std::vector<int>> out(7);
  for (int s : {0, 1, 2, 3, 4, 6}) out[size_t(s)] = outputs(op, subs, s, ctx, &acc[size_t(s)]);
  const core::DType dt = g_.value(o.outputs[4]).dtype;
  const size_t n = size_t(lanes_);
  std::vector<int> xe_local(n, -1), he_local(n, -1), ye_local(n, -1);
  // Expert side, of this lane's shape: under uniform routing a lane receives as many rows as
  // it sends; the real counts come with the routing.
  auto local = [&](int l, const std::string& name, int64_t cols, const Piece* like) {
    const int64_t rows = role(l).tensors[size_t(out[4][size_t(l)])].piece.box[0].numel();
    Piece p{Box{DimSlice{0, rows, 1, 0}, DimSlice{0, cols, 1, 0}}};
    if (like) p.part = like->part, p.parts = like->parts;
    TensorDesc t = scratch_tensor(name, p, dt);
    t.data_dependent = true;
    return add_tensor(l, t);
  };
  for (int l = 0; l < lanes_; ++l) {
    auto at = [&](int s) { return in[size_t(s)][size_t(l)]; };
    emit(l,
         compute(op, "moe.route", {{0, at(0)}, {1, at(1)}},
                 {{1, out[1][size_t(l)]},
                  {2, out[2][size_t(l)]},
                  {3, out[3][size_t(l)]},
                  {4, out[4][size_t(l)]}}),
         ctx);
    const int64_t C = role(l).tensors[size_t(out[4][size_t(l)])].piece.box[1].numel();
    xe_local[size_t(l)] = local(l, "moe.xe_local", C, nullptr);
  }
  moe_exchange(op, "moe.dispatch", true, out[4], xe_local, ctx);
  for (int l = 0; l < lanes_; ++l) {
    auto at = [&](int s) { return in[size_t(s)][size_t(l)]; };
    const int64_t C = role(l).tensors[size_t(out[4][size_t(l)])].piece.box[1].numel();
    const int64_t F = subs[size_t(l)].ins[2].piece.box[1].numel();
    const Piece ye_piece = role(l).tensors[size_t(out[6][size_t(l)])].piece;
    he_local[size_t(l)] = local(l, "moe.he_local", F, nullptr);
    ye_local[size_t(l)] = local(l, "moe.ye_local", C, &ye_piece);
    std::vector<Operand> w = {{-1, xe_local[size_t(l)]}, {2, at(2)}, {3, at(3)}, {4, at(4)}};
    if (at(5) >= 0) w.push_back({5, at(5)});
    emit(l, compute(op, "moe.experts", w, {{-1, he_local[size_t(l)]}, {-1, ye_local[size_t(l)]}}),
         ctx);
  }
  moe_exchange(op, "moe.return", false, ye_local, out[6], ctx);
  for (int l = 0; l < lanes_; ++l) {
    emit(l,
         compute(op, "moe.combine",
                 {{6, out[6][size_t(l)]}, {3, out[3][size_t(l)]}, {2, out[2][size_t(l)]}},
                 {{0, out[0][size_t(l)]}}),
         ctx);
    lane_[size_t(l)].moe_saved[{op, ctx.mb}] = {xe_local[size_t(l)], he_local[size_t(l)]};
  }
}

void StageBuilder::emit_moe_bwd(int op, const std::vector<SubOp>& subs, const Ctx& ctx) {
  const core::Op& o = g_.op(op);
  WEFT_CHECK(o.outputs.size() == 6, "moe.bwd under expert parallelism needs all six gradients");
  std::vector<std::vector<int>> in(12);
  for (int s : {0, 1, 2, 3, 4, 5, 6, 7, 8, 11}) in[size_t(s)] = inputs(op, subs, s, ctx);
  std::vector<std::vector<bool>> acc(6);
  std::vector<std::vector<int>> out(6);
  for (int s = 0; s < 6; ++s) out[size_t(s)] = outputs(op, subs, s, ctx, &acc[size_t(s)]);
  const core::DType dt = g_.value(o.outputs[0]).dtype;
  const size_t n = size_t(lanes_);
  std::vector<int> xe_local(n, -1), he_local(n, -1), dye(n, -1), dprobs(n, -1), dye_local(n, -1),
      dxe_local(n, -1), dxe(n, -1);
  auto like = [&](int l, const std::string& name, int tensor, bool data_dep) {
    TensorDesc t = role(l).tensors[size_t(tensor)];
    t = scratch_tensor(name, t.piece, dt);
    const TensorDesc& src = role(l).tensors[size_t(tensor)];
    t.shift_dim = src.shift_dim, t.shift = src.shift, t.data_dependent = data_dep;
    return add_tensor(l, t);
  };
  for (int l = 0; l < lanes_; ++l) {
    auto it = lane_[size_t(l)].moe_saved.find({o.mirror, ctx.mb});
    WEFT_CHECK(it != lane_[size_t(l)].moe_saved.end(), "moe.bwd before its forward's expert state");
    xe_local[size_t(l)] = it->second[0], he_local[size_t(l)] = it->second[1];
    auto at = [&](int s) { return in[size_t(s)][size_t(l)]; };
    // d(ye) = dout x routing weight is whole; the probability gradient (and later the
    // dispatched input gradient) inherit the expert outputs' partial sums under a tp split.
    const Piece ye = role(l).tensors[size_t(at(11))].piece;
    dye[size_t(l)] = like(l, "moe.dye", at(11), false);
    dprobs[size_t(l)] = like(l, "moe.dprobs", at(7), false);
    Piece& dye_piece = role(l).tensors[size_t(dye[size_t(l)])].piece;
    dye_piece.part = 0, dye_piece.parts = 1;
    Piece& dprobs_piece = role(l).tensors[size_t(dprobs[size_t(l)])].piece;
    dprobs_piece.part = ye.part, dprobs_piece.parts = ye.parts;
    emit(l,
         compute(op, "moe.combine", {{0, at(0)}, {11, at(11)}, {8, at(8)}, {7, at(7)}},
                 {{-1, dye[size_t(l)]}, {-1, dprobs[size_t(l)]}}),
         ctx);
    dye_local[size_t(l)] = like(l, "moe.dye_local", xe_local[size_t(l)], true);
  }
  moe_exchange(op, "moe.dispatch", true, dye, dye_local, ctx);
  for (int l = 0; l < lanes_; ++l) {
    auto at = [&](int s) { return in[size_t(s)][size_t(l)]; };
    dxe_local[size_t(l)] = like(l, "moe.dxe_local", xe_local[size_t(l)], true);
    // A partial sum over the tp lanes, as the expert outputs were: the return keeps the
    // addend, and the route's backward joins them.
    const Piece ye = role(l).tensors[size_t(at(11))].piece;
    Piece& dxe_piece = role(l).tensors[size_t(dxe_local[size_t(l)])].piece;
    dxe_piece.part = ye.part, dxe_piece.parts = ye.parts;
    std::vector<Operand> ops_in = {{-1, dye_local[size_t(l)]},
                                   {-1, xe_local[size_t(l)]},
                                   {-1, he_local[size_t(l)]},
                                   {3, at(3)},
                                   {5, at(5)}};
    std::vector<Operand> ops_out = {{-1, dxe_local[size_t(l)]}};
    for (int s = 2; s < 6; ++s)
      ops_out.push_back({s, out[size_t(s)][size_t(l)], acc[size_t(s)][size_t(l)]});
    emit(l, compute(op, "moe.experts", ops_in, ops_out), ctx);
    dxe[size_t(l)] = like(l, "moe.dxe", at(11), false);
  }
  moe_exchange(op, "moe.return", false, dxe_local, dxe, ctx);
  for (int l = 0; l < lanes_; ++l) {
    auto at = [&](int s) { return in[size_t(s)][size_t(l)]; };
    emit(l,
         compute(op, "moe.route",
                 {{-1, dxe[size_t(l)]},
                  {-1, dprobs[size_t(l)]},
                  {1, at(1)},
                  {2, at(2)},
                  {7, at(7)},
                  {8, at(8)}},
                 {{0, out[0][size_t(l)], acc[0][size_t(l)]},
                  {1, out[1][size_t(l)], acc[1][size_t(l)]}}),
         ctx);
  }
}

}  // namespace weft::planner
