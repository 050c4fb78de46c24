// run_compute on simulated shards in one process: every plain partition (column, row with
// the bias on part 0, attention heads, vocabulary-parallel embedding, batch), the
// vocabulary-parallel cross-entropy parts, the global-norm parts and AdamW on ZeRO shard
// views, each against the unsplit op; collectives between parts are plain loops here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "base/error.h"
#include "core/graph/op_parts.h"
#include "memory/host_allocator.h"

namespace weft::core {
namespace {

template <typename T>
constexpr double kTol = std::is_same_v<T, float> ? 1e-5 : 1e-10;

void set_at(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = float(v); break;
    case DType::kF64: t.data<double>()[i] = v; break;
    case DType::kI32: t.data<int32_t>()[i] = int32_t(v); break;
    default: FAIL() << "dtype";
  }
}
Tensor randn(const Shape& s, DType dt, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> nd(0.0, scale);
  Tensor t = Tensor::empty(s, dt);
  for (int64_t i = 0; i < t.numel(); ++i) set_at(t, i, nd(g));
  return t;
}
Tensor ids(const Shape& s, int64_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  Tensor t = Tensor::empty(s, DType::kI32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = int32_t(g() % uint64_t(V));
  return t;
}
Tensor filled(const Shape& s, DType dt, double v) {
  Tensor t = Tensor::empty(s, dt);
  t.fill_(v);
  return t;
}

// Flat indices of a box's elements in a whole tensor of `shape`, in local row-major order.
std::vector<int64_t> box_index(const Shape& shape, const PieceBox& box) {
  std::vector<int64_t> out = {0};
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<int64_t> next;
    for (int64_t base : out)
      for (int64_t i = 0; i < box[d].numel(); ++i)
        next.push_back(base * shape[d] + box[d].start + (i / box[d].size) * box[d].stride + i % box[d].size);
    out = std::move(next);
  }
  return out;
}
Tensor cut(const Tensor& whole, const PieceBox& box) {
  Tensor t = Tensor::empty(piece_shape(box), whole.dtype());
  std::vector<int64_t> idx = box_index(whole.shape(), box);
  for (size_t i = 0; i < idx.size(); ++i) set_at(t, int64_t(i), whole.item_at(idx[i]));
  return t;
}
void paste(Tensor& whole, const PieceBox& box, const Tensor& local, bool add = false) {
  std::vector<int64_t> idx = box_index(whole.shape(), box);
  ASSERT_EQ(int64_t(idx.size()), local.numel());
  for (size_t i = 0; i < idx.size(); ++i)
    set_at(whole, idx[i], (add ? whole.item_at(idx[i]) : 0.0) + local.contiguous().item_at(int64_t(i)));
}
PieceBox whole(const Shape& s) {
  PieceBox b;
  for (int64_t n : s) b.push_back({0, n});
  return b;
}
void add_into(Tensor& acc, const Tensor& x) { paste(acc, whole(acc.shape()), x, true); }

// max |a - b| relative to max |b|.
double rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  Tensor ac = a.contiguous(), bc = b.contiguous();
  double d = 0, m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, std::abs(ac.item_at(i) - bc.item_at(i)));
    m = std::max(m, std::abs(bc.item_at(i)));
  }
  return d / std::max(m, 1e-30);
}
#define EXPECT_CLOSE(a, b, tol) EXPECT_LE(rel_diff(a, b), tol) << #a " vs " #b

// Part k of n along dim d, in `groups` strided groups (the qkv layout).
PieceBox part(const Shape& s, size_t d, int64_t k, int64_t n, int64_t groups = 1) {
  PieceBox b = whole(s);
  const int64_t g = s[d] / groups, w = g / n;
  b[d] = groups == 1 ? PieceDim{k * w, w} : PieceDim{k * w, w, groups, g};
  return b;
}

Op make_op(const std::string& type, int ins, int outs) {
  Op op;
  op.type = type;
  for (int i = 0; i < ins; ++i) op.inputs.push_back(i);
  for (int i = 0; i < outs; ++i) op.outputs.push_back(ins + i);
  op.accumulate.assign(size_t(outs), false);
  return op;
}
void run_whole(const Op& op, std::vector<Tensor*> in, std::vector<Tensor*> out, const StepScalars& s = {}) {
  OpContext c{op, std::move(in), std::move(out), s, nullptr};
  op_def(op.type).run_cpu(c);
}
void run_whole_with(const Op& op, std::vector<Tensor*> in, std::vector<Tensor*> out, memory::Allocator* ws) {
  StepScalars s;
  OpContext c{op, std::move(in), std::move(out), s, ws};
  op_def(op.type).run_cpu(c);
}
LocalOperand opnd(int slot, Tensor* t, const PieceBox& box, const Shape& global, int split = 0, int splits = 1,
                  bool acc = false) {
  LocalOperand o;
  o.slot = slot;
  o.tensor = t;
  o.box = box;
  o.global_shape = global;
  o.split_index = split, o.split_count = splits;
  o.accumulate = acc;
  o.dtype = t->defined() ? t->dtype() : DType::kF32;
  return o;
}
// An undefined output is allocated with the operand's dtype.
LocalOperand typed(LocalOperand o, DType dt) {
  o.dtype = dt;
  return o;
}
LocalOperand scratch(const std::string& name, Tensor* t, DType dt = DType::kF32) {
  LocalOperand o;
  o.name = name;
  o.tensor = t;
  o.dtype = dt;
  return o;
}
void run_part(const Op& op, const std::string& p, std::vector<LocalOperand> in, std::vector<LocalOperand> out,
              const StepScalars& s = {}) {
  PartContext ctx{op, p, std::move(in), std::move(out), s};
  run_compute(ctx);
}

// ---- linear: column (plain and in 3 strided groups) and row parallel -------------------

template <typename T>
void check_linear() {
  const DType dt = dtype_of<T>();
  const int64_t B = 2, Tn = 3, K = 8, N = 12, n = 2;
  Tensor x = randn({B, Tn, K}, dt, 1), w = randn({N, K}, dt, 2), b = randn({N}, dt, 3), dy = randn({B, Tn, N}, dt, 4);
  Op fwd = make_op("linear", 3, 1), bwd = make_op("linear.bwd", 3, 3);
  bwd.attrs.ints["has_bias"] = 1;
  Tensor y = Tensor::empty({B, Tn, N}, dt), dx = Tensor::empty(x.shape(), dt);
  Tensor dw = Tensor::zeros(w.shape(), dt), db = Tensor::zeros(b.shape(), dt);
  run_whole(fwd, {&x, &w, &b}, {&y});
  run_whole(bwd, {&dy, &x, &w}, {&dx, &dw, &db});

  for (int64_t groups : {1, 3}) {  // column parallel
    Tensor y_all = Tensor::zeros(y.shape(), dt), dx_sum = Tensor::zeros(x.shape(), dt);
    Tensor dw_all = Tensor::zeros(w.shape(), dt), db_all = Tensor::zeros(b.shape(), dt);
    for (int64_t k = 0; k < n; ++k) {
      PieceBox wb = part(w.shape(), 0, k, n, groups), bb = part(b.shape(), 0, k, n, groups);
      PieceBox yb = part(y.shape(), 2, k, n, groups);
      Tensor wl = cut(w, wb), bl = cut(b, bb), yl, dyl = cut(dy, yb);
      run_part(fwd, "", {opnd(0, &x, {}, {}), opnd(1, &wl, wb, w.shape()), opnd(2, &bl, bb, b.shape())},
               {typed(opnd(0, &yl, yb, y.shape()), dt)});
      paste(y_all, yb, yl);
      // Outputs start as garbage: accumulate=false must overwrite, also where kernels add.
      Tensor dxl = filled(x.shape(), dt, 1e3), dwl = filled(wl.shape(), dt, 1e3), dbl = filled(bl.shape(), dt, 1e3);
      run_part(bwd, "", {opnd(0, &dyl, yb, y.shape()), opnd(1, &x, {}, {}), opnd(2, &wl, wb, w.shape())},
               {opnd(0, &dxl, {}, x.shape(), int(k), int(n)), opnd(1, &dwl, wb, w.shape()), opnd(2, &dbl, bb, b.shape())});
      add_into(dx_sum, dxl);
      paste(dw_all, wb, dwl);
      paste(db_all, bb, dbl);
    }
    EXPECT_CLOSE(y_all, y, kTol<T>);
    EXPECT_CLOSE(dx_sum, dx, kTol<T>);
    EXPECT_CLOSE(dw_all, dw, kTol<T>);
    EXPECT_CLOSE(db_all, db, kTol<T>);
  }

  // Row parallel: partial sums; the bias joins on part 0 only; every part computes the whole
  // bias gradient. Parameter gradients accumulate into what is there.
  Tensor y_sum = Tensor::zeros(y.shape(), dt), dx_all = Tensor::zeros(x.shape(), dt), dw_all = Tensor::zeros(w.shape(), dt);
  for (int64_t k = 0; k < n; ++k) {
    PieceBox xb = part(x.shape(), 2, k, n), wb = part(w.shape(), 1, k, n);
    Tensor xl = cut(x, xb), wl = cut(w, wb), yl;
    std::vector<LocalOperand> in = {opnd(0, &xl, xb, x.shape()), opnd(1, &wl, wb, w.shape())};
    if (k == 0) in.push_back(opnd(2, &b, {}, {}));
    run_part(fwd, "", in, {typed(opnd(0, &yl, {}, y.shape(), int(k), int(n)), dt)});
    add_into(y_sum, yl);
    Tensor dxl = filled(xl.shape(), dt, 1e3), before = randn(wl.shape(), dt, 10 + uint64_t(k));
    Tensor dwl = before.clone(), dbl = filled(b.shape(), dt, 1e3);
    run_part(bwd, "", {opnd(0, &dy, {}, {}), opnd(1, &xl, xb, x.shape()), opnd(2, &wl, wb, w.shape())},
             {opnd(0, &dxl, xb, x.shape()), opnd(1, &dwl, wb, w.shape(), 0, 1, true), opnd(2, &dbl, {}, {})});
    paste(dx_all, xb, dxl);
    for (int64_t i = 0; i < dwl.numel(); ++i) set_at(dwl, i, dwl.item_at(i) - before.item_at(i));
    paste(dw_all, wb, dwl);
    EXPECT_CLOSE(dbl, db, kTol<T>);
  }
  EXPECT_CLOSE(y_sum, y, kTol<T>);
  EXPECT_CLOSE(dx_all, dx, kTol<T>);
  EXPECT_CLOSE(dw_all, dw, kTol<T>);
}
TEST(OpParts, LinearColumnAndRowParallelF32) { check_linear<float>(); }
TEST(OpParts, LinearColumnAndRowParallelF64) { check_linear<double>(); }

// ---- attention by heads ----------------------------------------------------------------

TEST(OpParts, AttentionByHeads) {
  const DType dt = DType::kF64;
  const int64_t B = 2, Tn = 5, H = 4, C = 8, n = 2;
  Tensor qkv = randn({B, Tn, 3 * C}, dt, 5), dy = randn({B, Tn, C}, dt, 6);
  Op fwd = make_op("attention", 1, 2), bwd = make_op("attention.bwd", 3, 1);
  fwd.attrs.ints["heads"] = bwd.attrs.ints["heads"] = H;
  Tensor y = Tensor::empty({B, Tn, C}, dt), att = Tensor::empty({B, H, Tn, Tn}, dt), dqkv = Tensor::empty(qkv.shape(), dt);
  run_whole(fwd, {&qkv}, {&y, &att});
  run_whole(bwd, {&dy, &qkv, &att}, {&dqkv});
  Tensor y_all = Tensor::zeros(y.shape(), dt), att_all = Tensor::zeros(att.shape(), dt), dqkv_all = Tensor::zeros(qkv.shape(), dt);
  for (int64_t k = 0; k < n; ++k) {
    PieceBox qb = part(qkv.shape(), 2, k, n, 3), yb = part(y.shape(), 2, k, n), ab = part(att.shape(), 1, k, n);
    Tensor ql = cut(qkv, qb), yl, al, dyl = cut(dy, yb), dql = filled(ql.shape(), dt, 1e3);
    run_part(fwd, "", {opnd(0, &ql, qb, qkv.shape())}, {typed(opnd(0, &yl, yb, y.shape()), dt), typed(opnd(1, &al, ab, att.shape()), dt)});
    run_part(bwd, "", {opnd(0, &dyl, yb, y.shape()), opnd(1, &ql, qb, qkv.shape()), opnd(2, &al, ab, att.shape())},
             {opnd(0, &dql, qb, qkv.shape())});
    paste(y_all, yb, yl);
    paste(att_all, ab, al);
    paste(dqkv_all, qb, dql);
  }
  EXPECT_CLOSE(y_all, y, 1e-10);
  EXPECT_CLOSE(att_all, att, 1e-10);
  EXPECT_CLOSE(dqkv_all, dqkv, 1e-10);
}

// ---- the Llama block by KV-head groups and hidden units -----------------------------------

// Grouped-query attention split by KV heads g: each part holds whole query-head groups, so
// q, y and att are cut in contiguous head ranges and k, v in the matching KV heads.
TEST(OpParts, GqaAttentionByKvHeads) {
  const DType dt = DType::kF64;
  const int64_t B = 2, Tn = 5, H = 4, KV = 2, hd = 4, n = 2;
  Tensor q = randn({B, Tn, H * hd}, dt, 21), k = randn({B, Tn, KV * hd}, dt, 22), v = randn({B, Tn, KV * hd}, dt, 23);
  Tensor dy = randn({B, Tn, H * hd}, dt, 24);
  Op fwd = make_op("gqa_attention", 3, 2), bwd = make_op("gqa_attention.bwd", 5, 3);
  for (Op* o : {&fwd, &bwd}) {
    o->attrs.ints["heads"] = H;
    o->attrs.ints["kv_heads"] = KV;
    o->attrs.ints["head_dim"] = hd;
  }
  Tensor y = Tensor::empty(q.shape(), dt), att = Tensor::empty({B, H, Tn, Tn}, dt);
  Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
  run_whole(fwd, {&q, &k, &v}, {&y, &att});
  run_whole(bwd, {&dy, &q, &k, &v, &att}, {&dq, &dk, &dv});
  Tensor y_all = Tensor::zeros(y.shape(), dt), att_all = Tensor::zeros(att.shape(), dt);
  Tensor dq_all = Tensor::zeros(q.shape(), dt), dk_all = Tensor::zeros(k.shape(), dt), dv_all = Tensor::zeros(v.shape(), dt);
  for (int64_t p = 0; p < n; ++p) {
    PieceBox qb = part(q.shape(), 2, p, n), kb = part(k.shape(), 2, p, n), ab = part(att.shape(), 1, p, n);
    Tensor ql = cut(q, qb), kl = cut(k, kb), vl = cut(v, kb), dyl = cut(dy, qb), yl, al;
    run_part(fwd, "", {opnd(0, &ql, qb, q.shape()), opnd(1, &kl, kb, k.shape()), opnd(2, &vl, kb, v.shape())},
             {typed(opnd(0, &yl, qb, y.shape()), dt), typed(opnd(1, &al, ab, att.shape()), dt)});
    Tensor dql = filled(ql.shape(), dt, 1e3), dkl = filled(kl.shape(), dt, 1e3), dvl = filled(vl.shape(), dt, 1e3);
    run_part(bwd, "",
             {opnd(0, &dyl, qb, y.shape()), opnd(1, &ql, qb, q.shape()), opnd(2, &kl, kb, k.shape()),
              opnd(3, &vl, kb, v.shape()), opnd(4, &al, ab, att.shape())},
             {opnd(0, &dql, qb, q.shape()), opnd(1, &dkl, kb, k.shape()), opnd(2, &dvl, kb, v.shape())});
    paste(y_all, qb, yl);
    paste(att_all, ab, al);
    paste(dq_all, qb, dql);
    paste(dk_all, kb, dkl);
    paste(dv_all, kb, dvl);
  }
  EXPECT_CLOSE(y_all, y, 1e-12);
  EXPECT_CLOSE(att_all, att, 1e-12);
  EXPECT_CLOSE(dq_all, dq, 1e-12);
  EXPECT_CLOSE(dk_all, dk, 1e-12);
  EXPECT_CLOSE(dv_all, dv, 1e-12);
}

// Rotary embedding split by heads and SwiGLU by hidden units: element-wise per part.
TEST(OpParts, RopeByHeadsAndSwigluByHiddenUnits) {
  const DType dt = DType::kF32;
  const int64_t B = 2, Tn = 6, heads = 4, hd = 8, n = 2;
  Tensor x = randn({B, Tn, heads * hd}, dt, 31), dy = randn(x.shape(), dt, 32);
  Op rope = make_op("rope", 1, 1), rope_bwd = make_op("rope.bwd", 1, 1);
  for (Op* o : {&rope, &rope_bwd}) {
    o->attrs.ints["heads"] = heads;
    o->attrs.ints["head_dim"] = hd;
    o->attrs.floats["theta"] = 10000.0;
  }
  Tensor up = randn(x.shape(), dt, 33);
  Op sw = make_op("swiglu", 2, 1), sw_bwd = make_op("swiglu.bwd", 3, 2);
  Tensor y = Tensor::empty(x.shape(), dt), dx = Tensor::empty(x.shape(), dt);
  Tensor h = Tensor::empty(x.shape(), dt), dg = Tensor::empty(x.shape(), dt), du = Tensor::empty(x.shape(), dt);
  run_whole(rope, {&x}, {&y});
  run_whole(rope_bwd, {&dy}, {&dx});
  run_whole(sw, {&x, &up}, {&h});
  run_whole(sw_bwd, {&dy, &x, &up}, {&dg, &du});
  Tensor all[5] = {Tensor::zeros(x.shape(), dt), Tensor::zeros(x.shape(), dt), Tensor::zeros(x.shape(), dt),
                   Tensor::zeros(x.shape(), dt), Tensor::zeros(x.shape(), dt)};
  for (int64_t p = 0; p < n; ++p) {
    PieceBox xb = part(x.shape(), 2, p, n);
    Tensor xl = cut(x, xb), dyl = cut(dy, xb), ul = cut(up, xb), yl, dxl, hl;
    Tensor dgl = filled(xl.shape(), dt, 1e3), dul = filled(xl.shape(), dt, 1e3);
    run_part(rope, "", {opnd(0, &xl, xb, x.shape())}, {typed(opnd(0, &yl, xb, x.shape()), dt)});
    run_part(rope_bwd, "", {opnd(0, &dyl, xb, x.shape())}, {typed(opnd(0, &dxl, xb, x.shape()), dt)});
    run_part(sw, "", {opnd(0, &xl, xb, x.shape()), opnd(1, &ul, xb, x.shape())}, {typed(opnd(0, &hl, xb, x.shape()), dt)});
    run_part(sw_bwd, "", {opnd(0, &dyl, xb, x.shape()), opnd(1, &xl, xb, x.shape()), opnd(2, &ul, xb, x.shape())},
             {opnd(0, &dgl, xb, x.shape()), opnd(1, &dul, xb, x.shape())});
    Tensor* locals[5] = {&yl, &dxl, &hl, &dgl, &dul};
    for (int i = 0; i < 5; ++i) paste(all[i], xb, *locals[i]);
  }
  EXPECT_CLOSE(all[0], y, 1e-6);
  EXPECT_CLOSE(all[1], dx, 1e-6);
  EXPECT_CLOSE(all[2], h, 1e-6);
  EXPECT_CLOSE(all[3], dg, 1e-6);
  EXPECT_CLOSE(all[4], du, 1e-6);
}

// Backward kernels with one accumulate flag for several gradients: when only one output
// already holds a contribution, it is added to and the other overwritten.
TEST(OpParts, SwigluBackwardWithMixedAccumulateFlags) {
  const DType dt = DType::kF64;
  Tensor dy = randn({2, 3, 4}, dt, 41), g = randn(dy.shape(), dt, 42), u = randn(dy.shape(), dt, 43);
  Op bwd = make_op("swiglu.bwd", 3, 2);
  Tensor dg = Tensor::empty(dy.shape(), dt), du = Tensor::empty(dy.shape(), dt);
  run_whole(bwd, {&dy, &g, &u}, {&dg, &du});
  Tensor dg2 = filled(dy.shape(), dt, 1e3), du2 = filled(dy.shape(), dt, 2.0);
  bwd.accumulate = {false, true};
  memory::HostAllocator alloc;
  run_whole_with(bwd, {&dy, &g, &u}, {&dg2, &du2}, &alloc);
  EXPECT_CLOSE(dg2, dg, 1e-15);
  Tensor want = filled(dy.shape(), dt, 2.0);
  add_into(want, du);
  EXPECT_CLOSE(du2, want, 1e-15);
}

// RMSNorm by batch: the weight gradient is a partial sum over the parts.
TEST(OpParts, RmsNormBatchSplit) {
  const DType dt = DType::kF32;
  const int64_t B = 4, Tn = 3, C = 8, n = 2;
  Tensor x = randn({B, Tn, C}, dt, 51), w = randn({C}, dt, 52), dy = randn({B, Tn, C}, dt, 53);
  Op fwd = make_op("rmsnorm", 2, 2), bwd = make_op("rmsnorm.bwd", 4, 2);
  fwd.attrs.floats["eps"] = 1e-5;
  Tensor y = Tensor::empty(x.shape(), dt), rstd = Tensor::empty({B, Tn}, dt);
  Tensor dx = Tensor::empty(x.shape(), dt), dw = Tensor::zeros({C}, dt);
  run_whole(fwd, {&x, &w}, {&y, &rstd});
  run_whole(bwd, {&dy, &x, &w, &rstd}, {&dx, &dw});
  Tensor y_all = Tensor::zeros(y.shape(), dt), dx_all = Tensor::zeros(x.shape(), dt), dw_sum = Tensor::zeros({C}, dt);
  for (int64_t k = 0; k < n; ++k) {
    PieceBox xb = part(x.shape(), 0, k, n), rb = part(rstd.shape(), 0, k, n);
    Tensor xl = cut(x, xb), dyl = cut(dy, xb), yl, rl;
    run_part(fwd, "", {opnd(0, &xl, xb, x.shape()), opnd(1, &w, {}, {})},
             {opnd(0, &yl, xb, x.shape()), opnd(1, &rl, rb, rstd.shape())});
    paste(y_all, xb, yl);
    Tensor dxl = filled(xl.shape(), dt, 1e3), dwl = filled({C}, dt, 1e3);
    run_part(bwd, "",
             {opnd(0, &dyl, xb, x.shape()), opnd(1, &xl, xb, x.shape()), opnd(2, &w, {}, {}), opnd(3, &rl, rb, rstd.shape())},
             {opnd(0, &dxl, xb, x.shape()), opnd(1, &dwl, {}, {}, int(k), int(n))});
    paste(dx_all, xb, dxl);
    add_into(dw_sum, dwl);
  }
  EXPECT_CLOSE(y_all, y, 1e-6);
  EXPECT_CLOSE(dx_all, dx, 1e-6);
  EXPECT_CLOSE(dw_sum, dw, 1e-5);
}

// Llama's embedding has no position table: two inputs, one gradient, vocabulary-parallel.
TEST(OpParts, EmbeddingWithoutPositionsVocabParallel) {
  const DType dt = DType::kF32;
  const int64_t B = 3, Tn = 4, V = 10, C = 6, n = 2;
  Tensor tok = ids({B, Tn}, V, 61), wte = randn({V, C}, dt, 62), dx = randn({B, Tn, C}, dt, 63);
  Op fwd = make_op("embedding", 2, 1), bwd = make_op("embedding.bwd", 2, 1);
  bwd.attrs.ints["has_wpe"] = 0;
  Tensor x = Tensor::empty({B, Tn, C}, dt), dwte = Tensor::zeros(wte.shape(), dt);
  run_whole(fwd, {&tok, &wte}, {&x});
  run_whole(bwd, {&dx, &tok}, {&dwte});
  for (int64_t i = 0; i < B * Tn; ++i)  // x is the table's row of each token
    EXPECT_EQ(x.item_at(i * C + 2), wte.item_at(tok.data<int32_t>()[i] * C + 2));
  Tensor x_sum = Tensor::zeros(x.shape(), dt), dwte_all = Tensor::zeros(wte.shape(), dt);
  for (int64_t k = 0; k < n; ++k) {
    PieceBox wb = part(wte.shape(), 0, k, n);
    Tensor wl = cut(wte, wb), xl = filled(x.shape(), dt, 1e3), dwl = filled(wl.shape(), dt, 1e3);
    run_part(fwd, "", {opnd(0, &tok, {}, {}), opnd(1, &wl, wb, wte.shape())}, {opnd(0, &xl, {}, x.shape(), int(k), int(n))});
    run_part(bwd, "", {opnd(0, &dx, {}, {}), opnd(1, &tok, {}, {})}, {opnd(0, &dwl, wb, wte.shape())});
    add_into(x_sum, xl);
    paste(dwte_all, wb, dwl);
  }
  EXPECT_CLOSE(x_sum, x, 1e-6);
  EXPECT_CLOSE(dwte_all, dwte, 1e-6);
  // A token outside the vocabulary is refused, not read as zeros.
  tok.data<int32_t>()[3] = int32_t(V);
  EXPECT_THROW(run_whole(fwd, {&tok, &wte}, {&x}), InternalError);
}

// ---- vocabulary-parallel embedding ------------------------------------------------------

TEST(OpParts, EmbeddingVocabParallel) {
  const DType dt = DType::kF32;
  const int64_t B = 3, Tn = 4, V = 10, C = 6, n = 2;
  Tensor tok = ids({B, Tn}, V, 7), wte = randn({V, C}, dt, 8), wpe = randn({Tn, C}, dt, 9), dx = randn({B, Tn, C}, dt, 10);
  Op fwd = make_op("embedding", 3, 1), bwd = make_op("embedding.bwd", 2, 2);
  Tensor x = Tensor::empty({B, Tn, C}, dt), dwte = Tensor::zeros(wte.shape(), dt), dwpe = Tensor::zeros(wpe.shape(), dt);
  run_whole(fwd, {&tok, &wte, &wpe}, {&x});
  run_whole(bwd, {&dx, &tok}, {&dwte, &dwpe});
  Tensor x_sum = Tensor::zeros(x.shape(), dt), dwte_all = Tensor::zeros(wte.shape(), dt);
  for (int64_t k = 0; k < n; ++k) {
    PieceBox wb = part(wte.shape(), 0, k, n);
    Tensor wl = cut(wte, wb), xl = filled(x.shape(), dt, 1e3);
    std::vector<LocalOperand> in = {opnd(0, &tok, {}, {}), opnd(1, &wl, wb, wte.shape())};
    if (k == 0) in.push_back(opnd(2, &wpe, {}, {}));  // positions: part 0 only
    run_part(fwd, "", in, {opnd(0, &xl, {}, x.shape(), int(k), int(n))});
    add_into(x_sum, xl);
    Tensor dwl = filled(wl.shape(), dt, 1e3), dpl = filled(wpe.shape(), dt, 1e3);
    run_part(bwd, "", {opnd(0, &dx, {}, {}), opnd(1, &tok, {}, {})}, {opnd(0, &dwl, wb, wte.shape()), opnd(1, &dpl, {}, {})});
    paste(dwte_all, wb, dwl);
    EXPECT_CLOSE(dpl, dwpe, 1e-6);  // every part computes the whole position gradient
  }
  EXPECT_CLOSE(x_sum, x, 1e-6);
  EXPECT_CLOSE(dwte_all, dwte, 1e-6);
}

// ---- vocabulary-parallel cross-entropy --------------------------------------------------

template <typename T>
void check_cross_entropy(int64_t n) {
  const DType dt = dtype_of<T>();
  const int64_t B = 2, Tn = 3, V = 12;
  Tensor logits = randn({B, Tn, V}, dt, 11, 3.0), tgt = ids({B, Tn}, V, 12);
  Op fwd = make_op("cross_entropy", 2, 2), bwd = make_op("cross_entropy.bwd", 2, 1);
  StepScalars s;
  s.loss_scale = 0.25;
  Tensor loss = Tensor::empty({1}, DType::kF32), probs = Tensor::empty(logits.shape(), dt), dl = Tensor::empty(logits.shape(), dt);
  run_whole(fwd, {&logits, &tgt}, {&loss, &probs});
  run_whole(bwd, {&probs, &tgt}, {&dl}, s);

  std::vector<Tensor> ll, mx(static_cast<size_t>(n)), sums(static_cast<size_t>(n));
  std::vector<PieceBox> boxes;
  for (int64_t k = 0; k < n; ++k) {
    boxes.push_back(part(logits.shape(), 2, k, n));
    ll.push_back(cut(logits, boxes.back()));
  }
  auto lg = [&](int64_t k) { return opnd(0, &ll[size_t(k)], boxes[size_t(k)], logits.shape()); };
  for (int64_t k = 0; k < n; ++k) run_part(fwd, "ce.max", {lg(k)}, {scratch("ce.max", &mx[size_t(k)], dt)});
  Tensor mx_all = mx[0].clone();  // all_reduce(max)
  for (int64_t k = 1; k < n; ++k)
    for (int64_t i = 0; i < mx_all.numel(); ++i) set_at(mx_all, i, std::max(mx_all.item_at(i), mx[size_t(k)].item_at(i)));
  for (int64_t k = 0; k < n; ++k)
    run_part(fwd, "ce.sumexp", {lg(k), opnd(1, &tgt, {}, {}), scratch("ce.max", &mx_all)},
             {scratch("ce.sums", &sums[size_t(k)], dt)});
  Tensor sums_all = Tensor::zeros(sums[0].shape(), dt);  // all_reduce(sum)
  for (int64_t k = 0; k < n; ++k) add_into(sums_all, sums[size_t(k)]);
  Tensor probs_all = Tensor::zeros(probs.shape(), dt), dl_all = Tensor::zeros(dl.shape(), dt);
  for (int64_t k = 0; k < n; ++k) {
    Tensor lk = Tensor::empty({1}, DType::kF32), pk, dk;
    run_part(fwd, "ce.finish",
             {lg(k), opnd(1, &tgt, {}, {}), scratch("ce.max", &mx_all), scratch("ce.sums", &sums_all)},
             {opnd(0, &lk, {}, {}), typed(opnd(1, &pk, boxes[size_t(k)], logits.shape()), dt)});
    EXPECT_NEAR(lk.item(), loss.item(), 1e-6 * std::abs(loss.item()));  // the loss is whole on every part
    paste(probs_all, boxes[size_t(k)], pk);
    run_part(bwd, "", {opnd(0, &pk, boxes[size_t(k)], logits.shape()), opnd(1, &tgt, {}, {})},
             {typed(opnd(0, &dk, boxes[size_t(k)], logits.shape()), dt)}, s);
    paste(dl_all, boxes[size_t(k)], dk);
  }
  EXPECT_CLOSE(probs_all, probs, kTol<T>);
  EXPECT_CLOSE(dl_all, dl, kTol<T>);
}
TEST(OpParts, CrossEntropyVocabParallelF32) { check_cross_entropy<float>(3); }
TEST(OpParts, CrossEntropyVocabParallelF64) { check_cross_entropy<double>(4); }

// ---- batch split: layernorm's parameter gradients are partial sums over the parts --------

TEST(OpParts, LayerNormBatchSplit) {
  const DType dt = DType::kF32;
  const int64_t B = 4, Tn = 3, C = 8, n = 2;
  Tensor x = randn({B, Tn, C}, dt, 13), w = randn({C}, dt, 14), b = randn({C}, dt, 15), dy = randn({B, Tn, C}, dt, 16);
  Op fwd = make_op("layernorm", 3, 3), bwd = make_op("layernorm.bwd", 5, 3);
  fwd.attrs.floats["eps"] = 1e-5;
  Tensor y = Tensor::empty(x.shape(), dt), mean = Tensor::empty({B, Tn}, dt), rstd = Tensor::empty({B, Tn}, dt);
  Tensor dx = Tensor::empty(x.shape(), dt), dw = Tensor::zeros({C}, dt), db = Tensor::zeros({C}, dt);
  run_whole(fwd, {&x, &w, &b}, {&y, &mean, &rstd});
  run_whole(bwd, {&dy, &x, &w, &mean, &rstd}, {&dx, &dw, &db});
  Tensor y_all = Tensor::zeros(y.shape(), dt), dx_all = Tensor::zeros(x.shape(), dt);
  Tensor dw_sum = Tensor::zeros({C}, dt), db_sum = Tensor::zeros({C}, dt);
  for (int64_t k = 0; k < n; ++k) {
    PieceBox xb = part(x.shape(), 0, k, n), rb = part(mean.shape(), 0, k, n);
    Tensor xl = cut(x, xb), dyl = cut(dy, xb), yl, ml, rl;
    run_part(fwd, "", {opnd(0, &xl, xb, x.shape()), opnd(1, &w, {}, {}), opnd(2, &b, {}, {})},
             {opnd(0, &yl, xb, x.shape()), opnd(1, &ml, rb, mean.shape()), opnd(2, &rl, rb, mean.shape())});
    paste(y_all, xb, yl);
    Tensor dxl = filled(xl.shape(), dt, 1e3), dwl = filled({C}, dt, 1e3), dbl = filled({C}, dt, 1e3);
    run_part(bwd, "",
             {opnd(0, &dyl, xb, x.shape()), opnd(1, &xl, xb, x.shape()), opnd(2, &w, {}, {}), opnd(3, &ml, rb, mean.shape()),
              opnd(4, &rl, rb, mean.shape())},
             {opnd(0, &dxl, xb, x.shape()), opnd(1, &dwl, {}, {}, int(k), int(n)), opnd(2, &dbl, {}, {}, int(k), int(n))});
    paste(dx_all, xb, dxl);
    add_into(dw_sum, dwl);
    add_into(db_sum, dbl);
  }
  EXPECT_CLOSE(y_all, y, 1e-6);
  EXPECT_CLOSE(dx_all, dx, 1e-6);
  EXPECT_CLOSE(dw_sum, dw, 1e-5);
  EXPECT_CLOSE(db_sum, db, 1e-5);
}

// ---- global norm over shards (strided views, sub-box views) ------------------------------

TEST(OpParts, GlobalNormOverShards) {
  const DType dt = DType::kF32;
  Tensor g1 = randn({6, 4}, dt, 17), g2 = randn({9}, dt, 18), g3 = randn({6, 6}, dt, 19);
  Op gn = make_op("global_norm", 3, 1);
  Tensor norm = Tensor::empty({1}, DType::kF64);
  run_whole(gn, {&g1, &g2, &g3}, {&norm});
  // Rank r holds g1's columns [2r, 2r+2) (a strided view), g3's rows r, r+2, r+4 (a view
  // strides cannot express: given by `within`), and g2 only on rank 0 (a replica counts once).
  std::vector<Tensor> sharded(2), whole_sums(2);
  for (int r = 0; r < 2; ++r) {
    Tensor v1 = g1.slice(1, 2 * r, 2);
    ASSERT_FALSE(v1.is_contiguous());
    LocalOperand o3 = opnd(2, &g3, {}, {});
    o3.within = {{r, 1, 3, 2}, {0, 6}};
    run_part(gn, "norm.sumsq", {opnd(0, &v1, {}, {}), o3}, {scratch("norm.sumsq", &sharded[size_t(r)], DType::kF64)});
    std::vector<LocalOperand> w;
    if (r == 0) w.push_back(opnd(1, &g2, {}, {}));
    run_part(gn, "norm.sumsq", w, {scratch("norm.sumsq", &whole_sums[size_t(r)], DType::kF64)});
  }
  Tensor all_sharded = Tensor::zeros({1}, DType::kF64), all_whole = Tensor::zeros({1}, DType::kF64);
  for (int r = 0; r < 2; ++r) add_into(all_sharded, sharded[size_t(r)]), add_into(all_whole, whole_sums[size_t(r)]);
  Tensor out;
  LocalOperand oo = opnd(0, &out, {}, {1});
  oo.dtype = DType::kF64;
  run_part(gn, "norm.finish", {scratch("norm.sumsq", &all_sharded), scratch("norm.sumsq", &all_whole)}, {oo});
  ASSERT_EQ(out.dtype(), DType::kF64);  // allocated with the operand's dtype
  EXPECT_NEAR(out.item(), norm.item(), 1e-6 * norm.item());
}

// ---- AdamW on ZeRO shard views ------------------------------------------------------------

TEST(OpParts, AdamWOnZeroShardViews) {
  const DType dt = DType::kF32;
  const Shape ps = {6, 8};
  Tensor p = randn(ps, dt, 20), g = randn(ps, dt, 21), m = randn(ps, dt, 22, 0.1), v = randn(ps, dt, 23, 0.1);
  for (int64_t i = 0; i < v.numel(); ++i) set_at(v, i, std::abs(v.item_at(i)));
  Tensor norm = filled({1}, DType::kF64, 3.0);
  Op up = make_op("adamw", 5, 0);
  up.attrs.floats = {{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.1}, {"grad_clip", 1.0}};
  up.attrs.ints["decay"] = 1;
  StepScalars s;
  s.lr = 1e-2, s.step = 3;
  Tensor pw = p.clone(), mw = m.clone(), vw = v.clone();
  run_whole(up, {&pw, &g, &mw, &vw, &norm}, {}, s);
  // Three ways to hold a shard of the parameter: columns [0,4) as a strided view, columns
  // [4,8) given by `within` over the root, and (on a copy) rows {k, k+2, k+4} in 3 chunks.
  Tensor root = p.clone();
  std::vector<PieceBox> shards = {{{0, 6}, {0, 4}}, {{0, 6}, {4, 4}}};
  Tensor view = root.slice(1, 0, 4);
  ASSERT_FALSE(view.is_contiguous());
  for (int r = 0; r < 2; ++r) {
    Tensor gl = cut(g, shards[size_t(r)]), ml = cut(m, shards[size_t(r)]), vl = cut(v, shards[size_t(r)]);
    LocalOperand po = r == 0 ? opnd(0, &view, {}, {}) : opnd(0, &root, {}, {});
    if (r == 1) po.within = shards[1];
    run_part(up, "", {po, opnd(1, &gl, {}, {}), opnd(2, &ml, {}, {}), opnd(3, &vl, {}, {}), opnd(4, &norm, {}, {})}, {}, s);
    EXPECT_CLOSE(ml, cut(mw, shards[size_t(r)]), 1e-6);
    EXPECT_CLOSE(vl, cut(vw, shards[size_t(r)]), 1e-6);
  }
  EXPECT_CLOSE(root, pw, 1e-6);
  Tensor root2 = p.clone();
  for (int64_t k = 0; k < 2; ++k) {
    PieceBox box = {{k, 1, 3, 2}, {0, 8}};
    Tensor gl = cut(g, box), ml = cut(m, box), vl = cut(v, box);
    LocalOperand po = opnd(0, &root2, {}, {});
    po.within = box;
    run_part(up, "", {po, opnd(1, &gl, {}, {}), opnd(2, &ml, {}, {}), opnd(3, &vl, {}, {}), opnd(4, &norm, {}, {})}, {}, s);
  }
  EXPECT_CLOSE(root2, pw, 1e-6);
}

// ---- refusals ---------------------------------------------------------------------------

TEST(OpParts, RefusesMissingOperandsAndUnknownParts) {
  Tensor x = randn({2, 3, 4}, DType::kF32, 24), w = randn({5, 4}, DType::kF32, 25), y;
  Op fwd = make_op("linear", 3, 1);
  EXPECT_THROW(run_part(fwd, "", {opnd(0, &x, {}, {})}, {opnd(0, &y, {}, {2, 3, 5})}), InternalError);
  EXPECT_THROW(run_part(fwd, "ce.max", {opnd(0, &x, {}, {}), opnd(1, &w, {}, {})}, {opnd(0, &y, {}, {2, 3, 5})}),
               NotSupported);
  Op ce = make_op("cross_entropy", 2, 2);
  Tensor tgt = ids({2, 3}, 8, 26), probs, loss = Tensor::empty({1}, DType::kF32);
  EXPECT_THROW(run_part(ce, "", {opnd(0, &x, {{0, 2}, {0, 3}, {4, 4}}, {2, 3, 8}), opnd(1, &tgt, {}, {})},
                        {opnd(0, &loss, {}, {}), opnd(1, &probs, {{0, 2}, {0, 3}, {4, 4}}, {2, 3, 8})}),
               NotSupported);
}

}  // namespace
}  // namespace weft::core
