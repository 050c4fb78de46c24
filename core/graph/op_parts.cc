// run_compute: operand plumbing (slots, dropped operands, strided and sub-box views, output
// allocation), plain partitions on local shapes, the vocabulary-parallel cross-entropy parts
// and the global-norm parts. The MoE forward and backward live in op_parts_moe.cc.
#include "core/graph/op_parts.h"

#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/error.h"
#include "core/cpu/kernels.h"

namespace weft::core {

Shape piece_shape(const PieceBox& box) {
  Shape s;
  for (const PieceDim& d : box) s.push_back(d.numel());
  return s;
}

namespace parts_detail {
namespace {

// Copies between `local` (contiguous, the box's dense shape) and the sub-box `box` of
// `root` (any strides), chunk by chunk along the last dim.
void box_copy(const Tensor& root, const PieceBox& box, Tensor& local, bool into_local) {
  WEFT_CHECK(int64_t(box.size()) == root.dim() && local.is_contiguous() && local.dtype() == root.dtype(),
             "view box of rank ", box.size(), " over a tensor of shape ", shape_str(root.shape()));
  WEFT_CHECK(local.shape() == piece_shape(box), "view box ", shape_str(piece_shape(box)), " vs local ",
             shape_str(local.shape()));
  const size_t es = dtype_size(root.dtype());
  const int64_t nd = root.dim();
  if (local.numel() == 0) return;
  for (int64_t d = 0; d < nd; ++d) {
    const PieceDim& b = box[size_t(d)];
    WEFT_CHECK(b.start >= 0 && b.start + (b.count - 1) * b.stride + b.size <= root.size(d),
               "view box dim ", d, " leaves the tensor of shape ", shape_str(root.shape()));
  }
  auto root_index = [&](int64_t d, int64_t i) {
    const PieceDim& b = box[size_t(d)];
    return b.start + (i / b.size) * b.stride + i % b.size;
  };
  char* rb = static_cast<char*>(root.raw_data());
  char* lb = static_cast<char*>(local.raw_data());
  const auto& rs = root.strides();
  const PieceDim& last = box.back();
  std::vector<int64_t> idx(size_t(nd), 0);
  int64_t lpos = 0;
  for (;;) {
    int64_t base = 0;
    for (int64_t d = 0; d + 1 < nd; ++d) base += root_index(d, idx[size_t(d)]) * rs[size_t(d)];
    for (int64_t c = 0; c < last.count; ++c) {
      char* r = rb + (base + (last.start + c * last.stride) * rs.back()) * int64_t(es);
      char* l = lb + lpos * int64_t(es);
      if (rs.back() == 1) {
        into_local ? std::memcpy(l, r, size_t(last.size) * es) : std::memcpy(r, l, size_t(last.size) * es);
      } else {
        for (int64_t j = 0; j < last.size; ++j) {
          char* rj = r + j * rs.back() * int64_t(es);
          into_local ? std::memcpy(l + j * int64_t(es), rj, es) : std::memcpy(rj, l + j * int64_t(es), es);
        }
      }
      lpos += last.size;
    }
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      if (++idx[size_t(d)] < box[size_t(d)].numel()) break;
      idx[size_t(d)] = 0;
    }
    if (d < 0) break;
  }
}

}  // namespace

Operands::Operands(PartContext& ctx) : ctx_(ctx) {
  for (LocalOperand& o : ctx.in) {
    WEFT_CHECK(o.tensor && o.tensor->defined(), ctx.op.type, " ", ctx.part, ": input slot ", o.slot, " ",
               o.name, " is not defined");
    Bound b;
    b.desc = &o;
    if (!o.within.empty()) {
      b.local = Tensor::empty(piece_shape(o.within), o.tensor->dtype(), ctx.workspace, memory::Tag::kWorkspace);
      box_copy(*o.tensor, o.within, b.local, true);
    } else {
      b.direct = o.tensor->is_contiguous();
      b.local = b.direct ? *o.tensor : o.tensor->contiguous();
    }
    b.ready = true;
    in_.push_back(std::move(b));
  }
  for (LocalOperand& o : ctx.out) {
    WEFT_CHECK(o.tensor, ctx.op.type, " ", ctx.part, ": output slot ", o.slot, " ", o.name, " has no tensor");
    Bound b;
    b.desc = &o;
    out_.push_back(std::move(b));
  }
}

const Tensor* Operands::in(int slot) const {
  for (const Bound& b : in_)
    if (b.desc->slot == slot && slot >= 0) return &b.local;
  return nullptr;
}

const LocalOperand* Operands::in_desc(int slot) const {
  for (const Bound& b : in_)
    if (b.desc->slot == slot && slot >= 0) return b.desc;
  return nullptr;
}

std::vector<const Tensor*> Operands::all_inputs() const {
  std::vector<const Tensor*> v;
  for (const Bound& b : in_) v.push_back(&b.local);
  return v;
}

int Operands::find_scratch(std::vector<Bound>& v, const std::string& name, int nth) const {
  bool named = false;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].desc->slot >= 0) continue;
    if (!v[i].desc->name.empty()) named = true;
    if (v[i].desc->name == name) return int(i);
  }
  if (!named)
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i].desc->slot < 0 && nth-- == 0) return int(i);
  throw InternalError(ctx_.op.type + " " + ctx_.part + ": no scratch operand '" + name + "'");
}

const Tensor& Operands::scratch_in(const std::string& name, int nth) const {
  auto& v = const_cast<std::vector<Bound>&>(in_);
  return v[size_t(find_scratch(v, name, nth))].local;
}

Tensor& Operands::bind_out(Bound& b, const Shape& shape, bool zero) {
  if (b.ready) return b.local;
  LocalOperand& o = *b.desc;
  Tensor& t = *o.tensor;
  if (!t.defined()) {
    // Op values take their piece's shape; scratch the part's (data-dependent rows).
    Shape s = o.slot >= 0 && !o.box.empty() ? piece_shape(o.box)
              : o.slot >= 0 && !o.global_shape.empty() ? o.global_shape
              : !shape.empty() ? shape : !o.box.empty() ? piece_shape(o.box) : o.global_shape;
    WEFT_CHECK(!s.empty(), ctx_.op.type, " ", ctx_.part, ": cannot size undefined output slot ", o.slot, " ",
               o.name);
    t = Tensor::empty(s, o.dtype, ctx_.outputs, memory::Tag::kActivation);
  }
  if (!o.within.empty()) {
    b.local = Tensor::empty(piece_shape(o.within), t.dtype(), ctx_.workspace, memory::Tag::kWorkspace);
    if (o.accumulate) box_copy(t, o.within, b.local, true);
  } else if (t.is_contiguous()) {
    b.local = t;
    b.direct = true;
  } else {
    b.local = o.accumulate ? t.clone(ctx_.workspace) : Tensor::empty(t.shape(), t.dtype(), ctx_.workspace);
  }
  WEFT_CHECK(shape.empty() || b.local.numel() == shape_numel(shape), ctx_.op.type, " ", ctx_.part, ": output slot ", o.slot,
             " ", o.name, " is ", shape_str(b.local.shape()), ", the part writes ", shape_str(shape));
  if (zero && !o.accumulate) b.local.zero_();
  b.ready = b.written = true;
  return b.local;
}

Tensor& Operands::out(int slot, const Shape& shape, bool zero) {
  for (Bound& b : out_)
    if (b.desc->slot == slot && slot >= 0) return bind_out(b, shape, zero);
  throw InternalError(ctx_.op.type + " " + ctx_.part + ": the instruction has no output slot " +
                      std::to_string(slot));
}

Tensor& Operands::scratch_out(const std::string& name, int nth, const Shape& shape, bool zero) {
  return bind_out(out_[size_t(find_scratch(out_, name, nth))], shape, zero);
}

bool Operands::has_out(int slot) const {
  for (const Bound& b : out_)
    if (b.desc->slot == slot) return true;
  return false;
}

bool Operands::accumulate(int slot) const {
  for (const Bound& b : out_)
    if (b.desc->slot == slot) return b.desc->accumulate;
  return false;
}

bool Operands::scratch_accumulate(const std::string& name, int nth) const {
  auto& v = const_cast<std::vector<Bound>&>(out_);
  return v[size_t(find_scratch(v, name, nth))].desc->accumulate;
}

void Operands::mark_mutated(int slot) {
  for (Bound& b : in_)
    if (b.desc->slot == slot) b.written = true;
}

void Operands::finish() {
  auto back = [](Bound& b) {
    if (!b.written || b.direct) return;
    if (!b.desc->within.empty()) box_copy(*b.desc->tensor, b.desc->within, b.local, false);
    else b.desc->tensor->copy_from(b.local);
  };
  for (Bound& b : in_) back(b);
  for (Bound& b : out_) back(b);
}

}  // namespace parts_detail

namespace {

using parts_detail::Operands;

template <typename F>
void dispatch_float(const Tensor& t, F&& f) {
  if (t.dtype() == DType::kF32) f.template operator()<float>();
  else if (t.dtype() == DType::kF64) f.template operator()<double>();
  else throw NotSupported(str("CPU op on dtype ", dtype_name(t.dtype())));
}

// Index into the annotation's outputs of op.outputs[k] (backward ops skip some outputs).
int annotation_output(const Op& op, int k) {
  for (int ai = 0, seen = -1;; ++ai) {
    if (op.attrs.i_or("skip_out" + std::to_string(ai), 0)) continue;
    if (++seen == k) return ai;
  }
}
// Position in op.outputs of annotation output `ai`; -1 when skipped.
int output_position(const Op& op, int ai) {
  if (op.attrs.i_or("skip_out" + std::to_string(ai), 0)) return -1;
  int k = 0;
  for (int j = 0; j < ai; ++j) k += op.attrs.i_or("skip_out" + std::to_string(j), 0) ? 0 : 1;
  return k;
}

// Outputs (annotation indices) that the whole-op bindings always add into.
bool always_accumulates(const std::string& type, int ai) {
  if (type == "linear.bwd" || type == "layernorm.bwd") return ai == 1 || ai == 2;
  if (type == "matmul.bwd") return ai == 1;
  if (type == "rmsnorm.bwd") return ai == 1;
  return false;
}

int64_t global_dim(const LocalOperand& o, int64_t d) {
  const Shape& s = o.global_shape.empty() ? o.tensor->shape() : o.global_shape;
  return s.at(size_t(d < 0 ? d + int64_t(s.size()) : d));
}
int64_t box_start(const LocalOperand& o, int64_t d) {
  if (o.box.empty()) return 0;
  const PieceDim& b = o.box.at(size_t(d < 0 ? d + int64_t(o.box.size()) : d));
  WEFT_CHECK(b.count == 1, "a vocabulary slice must be one range");
  return b.start;
}

void check_ids(const Tensor& ids, int64_t V, const char* what) {
  const int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    WEFT_CHECK(p[i] >= 0 && p[i] < V, what, " ", p[i], " at position ", i, " is outside the vocabulary [0, ",
               V, ")");
}

const LocalOperand& need_desc(const Operands& ops, const Op& op, int slot) {
  const LocalOperand* d = ops.in_desc(slot);
  WEFT_CHECK(d, op.type, ": input slot ", slot, " is missing");
  return *d;
}

// ---- plain partitions ------------------------------------------------------------

void run_embedding(PartContext& ctx, Operands& ops) {
  const LocalOperand& wd = need_desc(ops, ctx.op, 1);
  const Tensor &tok = *ops.in(0), &wte = *ops.in(1);
  const Tensor* wpe = ops.in(2);
  const int64_t B = tok.size(0), T = tok.size(1), C = wte.size(1), V = wte.size(0);
  check_ids(tok, global_dim(wd, 0), "token id");
  Tensor& out = ops.out(0, {B, T, C});
  dispatch_float(wte, [&]<typename F>() {
    cpu::embedding_slice_forward<F>(tok.data<int32_t>(), wte.data<F>(), wpe ? wpe->data<F>() : nullptr,
                                    out.data<F>(), B, T, C, V, box_start(wd, 0));
  });
}

void run_embedding_bwd(PartContext& ctx, Operands& ops) {
  const Op& op = ctx.op;
  const Tensor &dx = *ops.in(0), &tok = *ops.in(1);
  const int64_t B = tok.size(0), T = tok.size(1), C = dx.size(-1);
  const int kw = output_position(op, 0), kp = output_position(op, 1);
  Tensor* dwte = kw >= 0 && ops.has_out(kw) ? &ops.out(kw, {}, true) : nullptr;
  Tensor* dwpe = kp >= 0 && ops.has_out(kp) ? &ops.out(kp, {}, true) : nullptr;
  int64_t V = 0, off = 0;
  if (dwte) {
    V = dwte->size(0);
    for (const LocalOperand& o : ctx.out)
      if (o.slot == kw) off = box_start(o, 0);
  }
  dispatch_float(dx, [&]<typename F>() {
    cpu::embedding_slice_backward<F>(dx.data<F>(), tok.data<int32_t>(), dwte ? dwte->data<F>() : nullptr,
                                     dwpe ? dwpe->data<F>() : nullptr, B, T, C, V, off);
  });
}

void run_cross_entropy_bwd_slice(PartContext& ctx, Operands& ops, int64_t off) {
  const Tensor &probs = *ops.in(0), &tgt = *ops.in(1);
  const int64_t V = probs.size(-1), N = probs.numel() / V;
  check_ids(tgt, global_dim(need_desc(ops, ctx.op, 0), -1), "target id");
  Tensor& dl = ops.out(0, probs.shape());
  dispatch_float(probs, [&]<typename F>() {
    cpu::cross_entropy_slice_backward<F>(probs.data<F>(), tgt.data<int32_t>(),
                                         F(ctx.scalars.loss_scale / double(N)), dl.data<F>(),
                                         ops.accumulate(0), N, V, off);
  });
}

void run_plain(PartContext& ctx, Operands& ops) {
  const Op& op = ctx.op;
  const std::string& t = op.type;
  if (t == "embedding") return run_embedding(ctx, ops);
  if (t == "embedding.bwd") return run_embedding_bwd(ctx, ops);
  if (t == "cross_entropy" || t == "cross_entropy.bwd") {
    const LocalOperand& d = need_desc(ops, op, 0);
    const bool sliced = d.tensor->size(-1) != global_dim(d, -1);
    if (sliced && t == "cross_entropy.bwd") return run_cross_entropy_bwd_slice(ctx, ops, box_start(d, -1));
    if (sliced)
      throw NotSupported("cross_entropy on a vocabulary slice runs as parts ce.max, ce.sumexp, ce.finish");
  }
  const OpDef& def = op_def(t);
  Op local = op;
  if (t == "attention" || t == "attention.bwd") {
    // Heads split: the local qkv holds the local heads' q, k and v chunks back to back.
    const LocalOperand& q = need_desc(ops, op, t == "attention" ? 0 : 1);
    const int64_t H = op.attrs.i("heads"), C = global_dim(q, 2) / 3, Cl = q.tensor->size(2) / 3;
    WEFT_CHECK(C % H == 0 && Cl % (C / H) == 0, "attention: local width ", Cl, " is not whole heads of ",
               C / H);
    local.attrs.ints["heads"] = Cl / (C / H);
  }
  std::vector<Tensor*> in;
  for (size_t s = 0; s < op.inputs.size(); ++s) {
    const Tensor* x = ops.in(int(s));
    if (!x) {
      // Only a trailing bias may be dropped (row-parallel linear parts other than 0).
      WEFT_CHECK(t == "linear" && s == 2, op.type, ": input slot ", s, " is missing");
      break;
    }
    in.push_back(const_cast<Tensor*>(x));
  }
  std::vector<Tensor*> out;
  if (def.mutates.empty()) {
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      bool zero = always_accumulates(t, annotation_output(op, int(k)));
      out.push_back(&ops.out(int(k), {}, zero));
      local.accumulate.at(k) = ops.accumulate(int(k));
    }
  } else {
    for (int s : def.mutates) ops.mark_mutated(s);
  }
  OpContext c{local, in, out, ctx.scalars, ctx.workspace};
  def.run_cpu(c);
}

// ---- vocabulary-parallel cross-entropy -------------------------------------------

std::vector<double> doubles(const Tensor& t, int64_t offset, int64_t n) {
  WEFT_CHECK(offset + n <= t.numel(), "scratch of ", t.numel(), " elements, need ", offset + n);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = t.item_at(offset + i);
  return v;
}
void store(Tensor& t, int64_t offset, const std::vector<double>& v, bool accumulate) {
  WEFT_CHECK(offset + int64_t(v.size()) <= t.numel(), "scratch of ", t.numel(), " elements");
  dispatch_float(t, [&]<typename F>() {
    F* p = t.data<F>() + offset;
    for (size_t i = 0; i < v.size(); ++i) p[i] = accumulate ? F(double(p[i]) + v[i]) : F(v[i]);
  });
}

void run_ce_part(PartContext& ctx, Operands& ops) {
  const std::string& part = ctx.part;
  const LocalOperand& ld = need_desc(ops, ctx.op, 0);
  const Tensor& logits = *ops.in(0);
  const int64_t V = logits.size(-1), N = logits.numel() / V, off = box_start(ld, -1);
  Shape rows(logits.shape().begin(), logits.shape().end() - 1);
  if (part == "ce.max") {
    std::vector<double> mx(static_cast<size_t>(N));
    dispatch_float(logits, [&]<typename F>() { cpu::cross_entropy_slice_max<F>(logits.data<F>(), mx.data(), N, V); });
    store(ops.scratch_out("ce.max", 0, rows), 0, mx, false);
    return;
  }
  const Tensor& tgt = *ops.in(1);
  WEFT_CHECK(tgt.numel() == N, "cross-entropy: ", tgt.numel(), " targets for ", N, " rows");
  std::vector<double> mx = doubles(ops.scratch_in("ce.max", 0), 0, N);
  if (part == "ce.sumexp") {
    check_ids(tgt, global_dim(ld, -1), "target id");
    std::vector<double> se(static_cast<size_t>(N)), tl(static_cast<size_t>(N));
    dispatch_float(logits, [&]<typename F>() {
      cpu::cross_entropy_slice_sumexp<F>(logits.data<F>(), tgt.data<int32_t>(), mx.data(), se.data(), tl.data(),
                                         N, V, off);
    });
    Shape pair = rows;
    pair.insert(pair.begin(), 2);
    Tensor& sums = ops.scratch_out("ce.sums", 0, pair);
    store(sums, 0, se, false);
    store(sums, N, tl, false);
    return;
  }
  WEFT_CHECK(part == "ce.finish", "unknown cross-entropy part ", part);
  const Tensor& sums = ops.scratch_in("ce.sums", 1);
  std::vector<double> se = doubles(sums, 0, N), tl = doubles(sums, N, N);
  Tensor& probs = ops.out(1, logits.shape());
  double mean = 0;
  dispatch_float(logits, [&]<typename F>() {
    mean = cpu::cross_entropy_slice_finish<F>(logits.data<F>(), mx.data(), se.data(), tl.data(), probs.data<F>(),
                                              N, V);
  });
  Tensor& loss = ops.out(0, {1});
  loss.fill_(ops.accumulate(0) ? loss.item() + mean : mean);
}

// ---- global norm -------------------------------------------------------------------

void run_norm_part(PartContext& ctx, Operands& ops) {
  double total = 0;
  if (ctx.part == "norm.sumsq") {
    for (const Tensor* g : ops.all_inputs())
      dispatch_float(*g, [&]<typename F>() { total += cpu::sum_squares<F>(g->data<F>(), g->numel()); });
    Tensor& s = ops.scratch_out("norm.sumsq", 0, {1});
    s.fill_(ops.scratch_accumulate("norm.sumsq", 0) ? s.item() + total : total);
    return;
  }
  WEFT_CHECK(ctx.part == "norm.finish", "unknown global-norm part ", ctx.part);
  for (const Tensor* s : ops.all_inputs()) total += s->item();
  ops.out(0, {1}).fill_(std::sqrt(total));
}

}  // namespace

void run_compute(PartContext& ctx) {
  Operands ops(ctx);
  const std::string &t = ctx.op.type, &p = ctx.part;
  if (t == "moe" || t == "moe.bwd") parts_detail::run_moe(ctx, ops);
  else if (p.empty()) run_plain(ctx, ops);
  else if (t == "cross_entropy" && p.rfind("ce.", 0) == 0) run_ce_part(ctx, ops);
  else if (t == "global_norm" && p.rfind("norm.", 0) == 0) run_norm_part(ctx, ops);
  else throw NotSupported("no CPU part '" + p + "' for op " + t);
  ops.finish();
}

std::vector<int64_t> moe_expert_counts(const Tensor& route, int64_t experts) {
  WEFT_CHECK(route.dim() == 2 && route.size(1) == 2 && route.dtype() == DType::kI32,
             "moe route must be (A,2) i32, got ", shape_str(route.shape()));
  Tensor r = route.contiguous();
  const int32_t* p = r.data<int32_t>();
  std::vector<int64_t> counts(size_t(experts), 0);
  int32_t last = 0;
  for (int64_t a = 0; a < r.size(0) && p[2 * a] >= 0; ++a) {
    WEFT_CHECK(p[2 * a + 1] >= last && p[2 * a + 1] < experts, "moe route row ", a, " names expert ",
               p[2 * a + 1], " out of order or range");
    last = p[2 * a + 1];
    ++counts[size_t(last)];
  }
  return counts;
}

}  // namespace weft::core
