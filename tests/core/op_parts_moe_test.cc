// MoE on simulated shards in one process, against the fused op: expert parallelism (the
// parts moe.route / moe.experts / moe.combine forward and backward, with the all_to_all_v
// dispatch and return emulated by copying rows), a split of the experts' hidden units
// (partial sums, the output bias and the balance-loss gradient on part 0 only), and both.
// Each ep member's tokens are its own batch part, so the reference runs the fused op per
// member with all the experts and sums the parameter gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "base/error.h"
#include "core/graph/op_parts.h"

namespace weft::core {
namespace {

template <typename T>
constexpr double kTol = std::is_same_v<T, float> ? 1e-5 : 1e-10;

template <typename T>
Tensor randn(const Shape& s, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> nd(0.0, scale);
  Tensor t = Tensor::empty(s, dtype_of<T>());
  for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = T(nd(g));
  return t;
}

// The sub-box [start, start+size) per dim of a contiguous tensor.
template <typename T>
Tensor cut(const Tensor& whole, const PieceBox& box) {
  Tensor t = Tensor::empty(piece_shape(box), whole.dtype());
  std::vector<int64_t> idx(box.size(), 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t off = 0, rem = i;
    for (size_t d = box.size(); d-- > 0;) idx[d] = rem % box[d].size, rem /= box[d].size;
    for (size_t d = 0; d < box.size(); ++d) off = off * whole.size(int64_t(d)) + box[d].start + idx[d];
    t.data<T>()[i] = whole.data<T>()[off];
  }
  return t;
}
template <typename T>
void add_into(Tensor& acc, const Tensor& x) {
  for (int64_t i = 0; i < acc.numel(); ++i) acc.data<T>()[i] += x.data<T>()[i];
}

double rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  Tensor ac = a.contiguous(), bc = b.contiguous();
  double d = 0, m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, std::abs(ac.item_at(i) - bc.item_at(i)));
    m = std::max(m, std::abs(bc.item_at(i)));
  }
  return d / std::max(m, 1e-30);
}
#define EXPECT_CLOSE(a, b, tol) EXPECT_LE(rel_diff(a, b), tol) << #a " vs " #b

LocalOperand opnd(int slot, Tensor* t, DType dt, int split = 0, int splits = 1, bool acc = false) {
  LocalOperand o;
  o.slot = slot, o.tensor = t, o.dtype = dt, o.split_index = split, o.split_count = splits, o.accumulate = acc;
  return o;
}
LocalOperand scratch(const std::string& name, Tensor* t, DType dt) {
  LocalOperand o = opnd(-1, t, dt);
  o.name = name;
  return o;
}
void run_part(const Op& op, const std::string& p, std::vector<LocalOperand> in, std::vector<LocalOperand> out,
              const StepScalars& s, std::vector<int64_t> expert_rows = {}) {
  PartContext ctx{op, p, std::move(in), std::move(out), s, nullptr, nullptr, std::move(expert_rows)};
  run_compute(ctx);
}

struct Config {
  int64_t ep, tp;
  double capacity_factor;
};

template <typename T>
struct Moe {
  static constexpr int64_t B = 2, Tn = 3, C = 6, F = 8, E = 4, k = 2, N = B * Tn, A = N * k;
  const DType dt = dtype_of<T>();
  Op fwd, bwd;
  StepScalars s;
  Tensor router = randn<T>({E, C}, 1), fcw = randn<T>({E, F, C}, 2, 0.5), fcb = randn<T>({E, F}, 3, 0.5);
  Tensor pw = randn<T>({E, C, F}, 4, 0.5), pb = randn<T>({E, C}, 5, 0.5);

  explicit Moe(double cf) {
    fwd.type = "moe", bwd.type = "moe.bwd";
    for (int i = 0; i < 6; ++i) fwd.inputs.push_back(i);
    for (int i = 0; i < 7; ++i) fwd.outputs.push_back(6 + i);
    for (int i = 0; i < 12; ++i) bwd.inputs.push_back(i);
    for (int i = 0; i < 6; ++i) bwd.outputs.push_back(12 + i);
    fwd.accumulate.assign(7, false), bwd.accumulate.assign(6, false);
    fwd.attrs.ints["top_k"] = k;
    fwd.attrs.floats = {{"capacity_factor", cf}, {"aux_coef", 0.3}};
    bwd.attrs = fwd.attrs;
    s.loss_scale = 0.5;
  }
  // The fused op on one batch part: outputs then gradients (zeroed parameter gradients).
  struct Ref {
    Tensor out, aux, probs, route, xe, he, ye, dy, dr, dfcw, dfcb, dpw, dpb;
  };
  Ref reference(Tensor& y, Tensor& dout) {
    Ref r{Tensor::empty({B, Tn, C}, dt), Tensor::empty({1}, DType::kF32), Tensor::empty({N, E}, dt),
          Tensor::empty({A, 2}, DType::kI32), Tensor::zeros({A, C}, dt), Tensor::zeros({A, F}, dt),
          Tensor::zeros({A, C}, dt), Tensor::empty({B, Tn, C}, dt), Tensor::zeros({E, C}, dt),
          Tensor::zeros(fcw.shape(), dt), Tensor::zeros(fcb.shape(), dt), Tensor::zeros(pw.shape(), dt),
          Tensor::zeros(pb.shape(), dt)};
    OpContext f{fwd, {&y, &router, &fcw, &fcb, &pw, &pb}, {&r.out, &r.aux, &r.probs, &r.route, &r.xe, &r.he, &r.ye}, s, nullptr};
    op_def("moe").run_cpu(f);
    OpContext b{bwd, {&dout, &y, &router, &fcw, &fcb, &pw, &pb, &r.probs, &r.route, &r.xe, &r.he, &r.ye},
                {&r.dy, &r.dr, &r.dfcw, &r.dfcb, &r.dpw, &r.dpb}, s, nullptr};
    op_def("moe.bwd").run_cpu(b);
    return r;
  }
  // Boxes of lane (tp index t of tp, expert shard j of ep).
  PieceBox fcw_box(int64_t t, int64_t tp, int64_t j, int64_t ep) const {
    return {{j * E / ep, E / ep}, {t * F / tp, F / tp}, {0, C}};
  }
  PieceBox fcb_box(int64_t t, int64_t tp, int64_t j, int64_t ep) const { return {{j * E / ep, E / ep}, {t * F / tp, F / tp}}; }
  PieceBox pw_box(int64_t t, int64_t tp, int64_t j, int64_t ep) const {
    return {{j * E / ep, E / ep}, {0, C}, {t * F / tp, F / tp}};
  }
  PieceBox pb_box(int64_t j, int64_t ep) const { return {{j * E / ep, E / ep}, {0, C}}; }
};

// ---- expert parallelism (and hidden units) through the custom parts ----------------------

template <typename T>
void check_expert_parallel(Config cfg) {
  Moe<T> m(cfg.capacity_factor);
  using M = Moe<T>;
  const int64_t ep = cfg.ep, tp = cfg.tp, El = M::E / ep, C = M::C, A = M::A;
  const DType dt = m.dt;
  std::vector<Tensor> y, dout;
  std::vector<typename M::Ref> ref;
  for (int64_t s = 0; s < ep; ++s) {
    y.push_back(randn<T>({M::B, M::Tn, C}, 100 + uint64_t(s)));
    dout.push_back(randn<T>({M::B, M::Tn, C}, 200 + uint64_t(s)));
    ref.push_back(m.reference(y.back(), dout.back()));
  }
  using Grid = std::vector<std::vector<Tensor>>;  // [tp][ep]
  auto grid = [&] { return Grid(size_t(tp), std::vector<Tensor>(size_t(ep))); };
  Grid aux = grid(), probs = grid(), route = grid(), xe = grid();
  Grid xe_local = grid(), he_local = grid(), ye_local = grid(), ye = grid(), out = grid();
  Grid wf = grid(), wfb = grid(), wp = grid(), wpb = grid();
  for (int64_t t = 0; t < tp; ++t)
    for (int64_t j = 0; j < ep; ++j) {
      wf[t][j] = cut<T>(m.fcw, m.fcw_box(t, tp, j, ep)), wfb[t][j] = cut<T>(m.fcb, m.fcb_box(t, tp, j, ep));
      wp[t][j] = cut<T>(m.pw, m.pw_box(t, tp, j, ep)), wpb[t][j] = cut<T>(m.pb, m.pb_box(j, ep));
    }

  // moe.route on every lane (replicated over tp), checked against the fused routing.
  for (int64_t t = 0; t < tp; ++t)
    for (int64_t s = 0; s < ep; ++s) {
      run_part(m.fwd, "moe.route", {opnd(0, &y[s], dt), opnd(1, &m.router, dt)},
               {opnd(1, &aux[t][s], DType::kF32), opnd(2, &probs[t][s], dt), opnd(3, &route[t][s], DType::kI32),
                opnd(4, &xe[t][s], dt)},
               m.s);
      EXPECT_EQ(aux[t][s].item(), ref[s].aux.item());
      EXPECT_CLOSE(probs[t][s], ref[s].probs, kTol<T>);
      EXPECT_EQ(route[t][s].template to_vector<int32_t>(), ref[s].route.template to_vector<int32_t>());
    }
  // all_to_all_v by expert shard: rows of source s for member j, and the counts it learns.
  std::vector<std::vector<int64_t>> counts, off(size_t(ep), std::vector<int64_t>(size_t(ep) + 1, 0));
  for (int64_t s = 0; s < ep; ++s) {
    counts.push_back(moe_expert_counts(route[0][s], M::E));
    for (int64_t j = 0; j < ep; ++j)
      off[s][j + 1] = off[s][j] + std::accumulate(counts[s].begin() + j * El, counts[s].begin() + (j + 1) * El, int64_t(0));
  }
  std::vector<std::vector<int64_t>> expert_rows(static_cast<size_t>(ep));
  for (int64_t j = 0; j < ep; ++j)
    for (int64_t s = 0; s < ep; ++s)
      for (int64_t e = 0; e < El; ++e) expert_rows[j].push_back(counts[s][size_t(j * El + e)]);
  auto dispatch = [&](Grid& from, int64_t t, int64_t j) {
    int64_t total = 0;
    for (int64_t s = 0; s < ep; ++s) total += off[s][j + 1] - off[s][j];
    Tensor local = Tensor::empty({total, C}, dt);
    for (int64_t s = 0, r = 0; s < ep; r += off[s][j + 1] - off[s][j], ++s)
      local.slice(0, r, off[s][j + 1] - off[s][j]).copy_from(from[t][s].slice(0, off[s][j], off[s][j + 1] - off[s][j]));
    return local;
  };
  auto give_back = [&](Grid& from, int64_t t, int64_t s) {
    Tensor tok = Tensor::zeros({A, C}, dt);
    for (int64_t j = 0; j < ep; ++j) {
      int64_t r = 0;
      for (int64_t q = 0; q < s; ++q) r += off[q][j + 1] - off[q][j];
      tok.slice(0, off[s][j], off[s][j + 1] - off[s][j]).copy_from(from[t][j].slice(0, r, off[s][j + 1] - off[s][j]));
    }
    return tok;
  };
  for (int64_t t = 0; t < tp; ++t)
    for (int64_t j = 0; j < ep; ++j) {
      xe_local[t][j] = dispatch(xe, t, j);
      std::vector<LocalOperand> in = {scratch("moe.xe_local", &xe_local[t][j], dt), opnd(2, &wf[t][j], dt),
                                      opnd(3, &wfb[t][j], dt), opnd(4, &wp[t][j], dt)};
      if (t == 0) in.push_back(opnd(5, &wpb[t][j], dt));  // the output bias: hidden-unit part 0 only
      run_part(m.fwd, "moe.experts", in,
               {scratch("moe.he_local", &he_local[t][j], dt), scratch("moe.ye_local", &ye_local[t][j], dt)}, m.s,
               expert_rows[j]);
    }
  for (int64_t s = 0; s < ep; ++s) {
    Tensor sum = Tensor::zeros({M::B, M::Tn, C}, dt);
    for (int64_t t = 0; t < tp; ++t) {
      ye[t][s] = give_back(ye_local, t, s);
      run_part(m.fwd, "moe.combine",
               {opnd(6, &ye[t][s], dt, int(t), int(tp)), opnd(3, &route[t][s], DType::kI32), opnd(2, &probs[t][s], dt)},
               {opnd(0, &out[t][s], dt, int(t), int(tp))}, m.s);
      add_into<T>(sum, out[t][s]);
    }
    EXPECT_CLOSE(sum, ref[s].out, kTol<T>);
  }

  // Backward, in the same order as planner/lower_custom.cc emits it.
  Grid dye = grid(), dprobs = grid(), dye_local = grid(), dxe_local = grid(), dxe = grid(), dy = grid(), dr = grid();
  Grid gf = grid(), gfb = grid(), gp = grid(), gpb = grid();
  for (int64_t t = 0; t < tp; ++t)
    for (int64_t s = 0; s < ep; ++s)
      run_part(m.bwd, "moe.combine",
               {opnd(0, &dout[s], dt), opnd(11, &ye[t][s], dt, int(t), int(tp)), opnd(8, &route[t][s], DType::kI32),
                opnd(7, &probs[t][s], dt)},
               {scratch("moe.dye", &dye[t][s], dt), scratch("moe.dprobs", &dprobs[t][s], dt)}, m.s);
  for (int64_t t = 0; t < tp; ++t)
    for (int64_t j = 0; j < ep; ++j) {
      dye_local[t][j] = dispatch(dye, t, j);
      run_part(m.bwd, "moe.experts",
               {scratch("moe.dye_local", &dye_local[t][j], dt), scratch("moe.xe_local", &xe_local[t][j], dt),
                scratch("moe.he_local", &he_local[t][j], dt), opnd(3, &wf[t][j], dt), opnd(5, &wp[t][j], dt)},
               {scratch("moe.dxe_local", &dxe_local[t][j], dt), opnd(2, &gf[t][j], dt), opnd(3, &gfb[t][j], dt),
                opnd(4, &gp[t][j], dt), opnd(5, &gpb[t][j], dt)},
               m.s, expert_rows[j]);
    }
  Tensor dr_sum = Tensor::zeros({M::E, C}, dt), dr_ref = Tensor::zeros({M::E, C}, dt);
  for (int64_t s = 0; s < ep; ++s) {
    Tensor dy_sum = Tensor::zeros({M::B, M::Tn, C}, dt);
    for (int64_t t = 0; t < tp; ++t) {
      dxe[t][s] = give_back(dxe_local, t, s);
      run_part(m.bwd, "moe.route",
               {scratch("moe.dxe", &dxe[t][s], dt), scratch("moe.dprobs", &dprobs[t][s], dt), opnd(1, &y[s], dt),
                opnd(2, &m.router, dt), opnd(7, &probs[t][s], dt), opnd(8, &route[t][s], DType::kI32)},
               {opnd(0, &dy[t][s], dt), opnd(1, &dr[t][s], dt)}, m.s);
      add_into<T>(dy_sum, dy[t][s]);
      add_into<T>(dr_sum, dr[t][s]);
    }
    EXPECT_CLOSE(dy_sum, ref[s].dy, kTol<T>);
    add_into<T>(dr_ref, ref[s].dr);
  }
  EXPECT_CLOSE(dr_sum, dr_ref, kTol<T>);
  // Expert gradients: the sum over every member's tokens, each lane holding its box.
  Tensor f_ref = Tensor::zeros(m.fcw.shape(), dt), fb_ref = Tensor::zeros(m.fcb.shape(), dt);
  Tensor p_ref = Tensor::zeros(m.pw.shape(), dt), pb_ref = Tensor::zeros(m.pb.shape(), dt);
  for (int64_t s = 0; s < ep; ++s)
    add_into<T>(f_ref, ref[s].dfcw), add_into<T>(fb_ref, ref[s].dfcb), add_into<T>(p_ref, ref[s].dpw),
        add_into<T>(pb_ref, ref[s].dpb);
  for (int64_t t = 0; t < tp; ++t)
    for (int64_t j = 0; j < ep; ++j) {
      EXPECT_CLOSE(gf[t][j], cut<T>(f_ref, m.fcw_box(t, tp, j, ep)), kTol<T>);
      EXPECT_CLOSE(gfb[t][j], cut<T>(fb_ref, m.fcb_box(t, tp, j, ep)), kTol<T>);
      EXPECT_CLOSE(gp[t][j], cut<T>(p_ref, m.pw_box(t, tp, j, ep)), kTol<T>);
      EXPECT_CLOSE(gpb[t][j], cut<T>(pb_ref, m.pb_box(j, ep)), kTol<T>);  // whole on every tp part
    }
}
TEST(OpPartsMoe, ExpertParallelF64) { check_expert_parallel<double>({2, 1, 0.0}); }
TEST(OpPartsMoe, ExpertParallelWithCapacityF32) { check_expert_parallel<float>({2, 1, 1.0}); }
TEST(OpPartsMoe, ExpertAndHiddenParallelF64) { check_expert_parallel<double>({2, 2, 1.0}); }
TEST(OpPartsMoe, HiddenParallelThroughPartsF32) { check_expert_parallel<float>({1, 2, 0.0}); }

// ---- the whole op on a slice of the hidden units (part "") --------------------------------

template <typename T>
void check_hidden_plain(double cf) {
  Moe<T> m(cf);
  using M = Moe<T>;
  const int64_t tp = 2, Fl = M::F / tp, A = M::A, C = M::C;
  const DType dt = m.dt;
  Tensor y = randn<T>({M::B, M::Tn, C}, 300), dout = randn<T>({M::B, M::Tn, C}, 301);
  typename M::Ref r = m.reference(y, dout);
  Tensor out_sum = Tensor::zeros(r.out.shape(), dt), dy_sum = Tensor::zeros(r.dy.shape(), dt);
  Tensor dr_sum = Tensor::zeros(r.dr.shape(), dt);
  for (int64_t t = 0; t < tp; ++t) {
    Tensor wf = cut<T>(m.fcw, m.fcw_box(t, tp, 0, 1)), wfb = cut<T>(m.fcb, m.fcb_box(t, tp, 0, 1));
    Tensor wp = cut<T>(m.pw, m.pw_box(t, tp, 0, 1));
    Tensor out, aux, probs, route, xe, he, ye;
    std::vector<LocalOperand> in = {opnd(0, &y, dt), opnd(1, &m.router, dt), opnd(2, &wf, dt), opnd(3, &wfb, dt),
                                    opnd(4, &wp, dt)};
    if (t == 0) in.push_back(opnd(5, &m.pb, dt));
    run_part(m.fwd, "", in,
             {opnd(0, &out, dt, int(t), int(tp)), opnd(1, &aux, DType::kF32), opnd(2, &probs, dt),
              opnd(3, &route, DType::kI32), opnd(4, &xe, dt), opnd(5, &he, dt), opnd(6, &ye, dt, int(t), int(tp))},
             m.s);
    // Whole on every part: the routing state; a slice: he; partial sums: out and ye.
    EXPECT_EQ(route.template to_vector<int32_t>(), r.route.template to_vector<int32_t>());
    EXPECT_EQ(aux.item(), r.aux.item());
    EXPECT_CLOSE(xe, r.xe, kTol<T>);
    EXPECT_CLOSE(he, cut<T>(r.he, {{0, A}, {t * Fl, Fl}}), kTol<T>);
    add_into<T>(out_sum, out);
    Tensor dy = Tensor::empty(y.shape(), dt), dr = Tensor::zeros(r.dr.shape(), dt);
    Tensor gf = Tensor::zeros(wf.shape(), dt), gfb = Tensor::zeros(wfb.shape(), dt), gp = Tensor::zeros(wp.shape(), dt);
    Tensor gpb;
    run_part(m.bwd, "",
             {opnd(0, &dout, dt), opnd(1, &y, dt), opnd(2, &m.router, dt), opnd(3, &wf, dt), opnd(4, &wfb, dt),
              opnd(5, &wp, dt), opnd(6, &m.pb, dt), opnd(7, &probs, dt), opnd(8, &route, DType::kI32), opnd(9, &xe, dt),
              opnd(10, &he, dt), opnd(11, &ye, dt, int(t), int(tp))},
             {opnd(0, &dy, dt, int(t), int(tp)), opnd(1, &dr, dt, int(t), int(tp), true), opnd(2, &gf, dt, 0, 1, true),
              opnd(3, &gfb, dt, 0, 1, true), opnd(4, &gp, dt, 0, 1, true), opnd(5, &gpb, dt)},
             m.s);
    add_into<T>(dy_sum, dy);
    add_into<T>(dr_sum, dr);
    EXPECT_CLOSE(gf, cut<T>(r.dfcw, m.fcw_box(t, tp, 0, 1)), kTol<T>);
    EXPECT_CLOSE(gfb, cut<T>(r.dfcb, m.fcb_box(t, tp, 0, 1)), kTol<T>);
    EXPECT_CLOSE(gp, cut<T>(r.dpw, m.pw_box(t, tp, 0, 1)), kTol<T>);
    EXPECT_CLOSE(gpb, r.dpb, kTol<T>);
  }
  EXPECT_CLOSE(out_sum, r.out, kTol<T>);
  EXPECT_CLOSE(dy_sum, r.dy, kTol<T>);
  EXPECT_CLOSE(dr_sum, r.dr, kTol<T>);  // includes the balance-loss term exactly once
}
TEST(OpPartsMoe, HiddenParallelWholeOpF64) { check_hidden_plain<double>(0.0); }
TEST(OpPartsMoe, HiddenParallelWholeOpWithCapacityF32) { check_hidden_plain<float>(1.0); }

TEST(OpPartsMoe, ExpertsNeedTheirRowCounts) {
  Moe<float> m(0.0);
  Tensor xe = randn<float>({5, Moe<float>::C}, 400), he, ye;
  EXPECT_THROW(run_part(m.fwd, "moe.experts",
                        {scratch("moe.xe_local", &xe, DType::kF32), opnd(2, &m.fcw, DType::kF32),
                         opnd(3, &m.fcb, DType::kF32), opnd(4, &m.pw, DType::kF32)},
                        {scratch("moe.he_local", &he, DType::kF32), scratch("moe.ye_local", &ye, DType::kF32)}, m.s),
               InternalError);
  // More rows claimed than arrived.
  EXPECT_THROW(run_part(m.fwd, "moe.experts",
                        {scratch("moe.xe_local", &xe, DType::kF32), opnd(2, &m.fcw, DType::kF32),
                         opnd(3, &m.fcb, DType::kF32), opnd(4, &m.pw, DType::kF32)},
                        {scratch("moe.he_local", &he, DType::kF32), scratch("moe.ye_local", &ye, DType::kF32)}, m.s,
                        {2, 2, 2, 0}),
               InternalError);
}

}  // namespace
}  // namespace weft::core
