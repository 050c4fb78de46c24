// Kernel bindings and backward builders of the Llama block's ops: RMSNorm, rotary
// embedding, grouped-query attention and the SiLU-gated product (SwiGLU).
// Shapes: B batch, T sequence, C channels, H query heads, KV key/value heads, hd head size.
// Head counts are read from the local widths (width / head_dim), so the same binding runs a
// tensor-parallel part that holds only some heads.
#include <vector>

#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/graph/op_bind.h"
#include "core/graph/op_impls.h"

namespace weft::core::ops {
using namespace bind;
namespace {

int64_t heads_of(const Tensor& x, const Op& op) {
  const int64_t hd = op.attrs.i("head_dim");
  WEFT_CHECK(hd > 0 && x.size(-1) % hd == 0, op.type, ": width ", x.size(-1),
             " is not whole heads of ", hd);
  return x.size(-1) / hd;
}

// Backward kernels that write several gradients take one accumulate flag for all of them.
// When autodiff asks for different flags (one gradient already holds a contribution), the
// kernel writes fresh temporaries and each is then copied or added to its output.
template <typename F, typename Kernel>
void run_multi_grad(OpContext& c, int n, Kernel&& kernel) {
  std::vector<Tensor*> outs;
  bool same = true;
  for (int k = 0; k < n; ++k) {
    Tensor* t = out_or_null(c, k);
    WEFT_CHECK(t, c.op.type, ": gradient ", k, " was skipped, but the kernel writes all ", n);
    outs.push_back(t);
    same = same && acc_of(c, k) == acc_of(c, 0);
  }
  if (same) {
    std::vector<F*> p;
    for (Tensor* t : outs) p.push_back(t->data<F>());
    kernel(p, acc_of(c, 0));
    return;
  }
  std::vector<Tensor> tmp;
  std::vector<F*> p;
  for (Tensor* t : outs) {
    tmp.push_back(Tensor::empty(t->shape(), t->dtype(), c.workspace, memory::Tag::kWorkspace));
    p.push_back(tmp.back().data<F>());
  }
  kernel(p, false);
  for (int k = 0; k < n; ++k) {
    if (acc_of(c, k)) cpu::axpy<F>(F(1), p[size_t(k)], outs[size_t(k)]->data<F>(), tmp[size_t(k)].numel());
    else outs[size_t(k)]->copy_from(tmp[size_t(k)]);
  }
}

}  // namespace

// ---- rmsnorm: x, w -> y, rstd -------------------------------------------------------
void run_rmsnorm(OpContext& c) {
  const Tensor& x = *c.in[0];
  dispatch_float(x, [&]<typename F>() {
    cpu::rmsnorm_forward<F>(x.data<F>(), c.in[1]->data<F>(), c.out[0]->data<F>(),
                            c.out[1]->data<F>(), rows(x), x.size(-1), F(c.op.attrs.f("eps")));
  });
}
void run_rmsnorm_bwd(OpContext& c) {
  const Tensor &dy = *c.in[0], &x = *c.in[1];
  Tensor* dx = out_or_null(c, 0);
  dispatch_float(x, [&]<typename F>() {
    cpu::rmsnorm_backward<F>(dy.data<F>(), x.data<F>(), c.in[2]->data<F>(), c.in[3]->data<F>(),
                             ptr<F>(dx), dx && acc_of(c, 0), ptr<F>(out_or_null(c, 1)), rows(x),
                             x.size(-1));
  });
}
void bwd_rmsnorm(Autodiff& ad, const Op& f) {
  ad.emit(f, "rmsnorm.bwd", {ad.grad(f.outputs[0]), f.inputs[0], f.inputs[1], f.outputs[1]},
          {f.inputs[0], f.inputs[1]});
}

// ---- rope: x (B,T,heads*hd) -> y, rotated per head by position ------------------------
void run_rope(OpContext& c) {
  const Tensor& x = *c.in[0];
  dispatch_float(x, [&]<typename F>() {
    cpu::rope_forward<F>(x.data<F>(), c.out[0]->data<F>(), x.size(0), x.size(1), heads_of(x, c.op),
                         c.op.attrs.i("head_dim"), c.op.attrs.f("theta"));
  });
}
void run_rope_bwd(OpContext& c) {
  const Tensor& dy = *c.in[0];
  dispatch_float(dy, [&]<typename F>() {
    cpu::rope_backward<F>(dy.data<F>(), c.out[0]->data<F>(), c.accumulate(0), dy.size(0),
                          dy.size(1), heads_of(dy, c.op), c.op.attrs.i("head_dim"),
                          c.op.attrs.f("theta"));
  });
}
void bwd_rope(Autodiff& ad, const Op& f) {
  ad.emit(f, "rope.bwd", {ad.grad(f.outputs[0])}, {f.inputs[0]}, f.attrs);
}

// ---- swiglu: gate, up -> silu(gate) * up ------------------------------------------------
void run_swiglu(OpContext& c) {
  dispatch_float(*c.in[0], [&]<typename F>() {
    cpu::swiglu_forward<F>(c.in[0]->data<F>(), c.in[1]->data<F>(), c.out[0]->data<F>(),
                           c.in[0]->numel());
  });
}
void run_swiglu_bwd(OpContext& c) {
  const Tensor &dy = *c.in[0], &gate = *c.in[1], &up = *c.in[2];
  dispatch_float(dy, [&]<typename F>() {
    run_multi_grad<F>(c, 2, [&](const std::vector<F*>& g, bool acc) {
      cpu::swiglu_backward<F>(dy.data<F>(), gate.data<F>(), up.data<F>(), g[0], g[1], acc,
                              dy.numel());
    });
  });
}
void bwd_swiglu(Autodiff& ad, const Op& f) {
  ad.emit(f, "swiglu.bwd", {ad.grad(f.outputs[0]), f.inputs[0], f.inputs[1]},
          {f.inputs[0], f.inputs[1]});
}

// ---- grouped-query causal attention: q, k, v -> y (B,T,H*hd), att (B,H,T,T) -----------
void run_gqa_attention(OpContext& c) {
  const Tensor &q = *c.in[0], &k = *c.in[1], &v = *c.in[2];
  dispatch_float(q, [&]<typename F>() {
    cpu::gqa_attention_forward<F>(q.data<F>(), k.data<F>(), v.data<F>(), c.out[0]->data<F>(),
                                  c.out[1]->data<F>(), q.size(0), q.size(1), heads_of(q, c.op),
                                  heads_of(k, c.op), c.op.attrs.i("head_dim"));
  });
}
void run_gqa_attention_bwd(OpContext& c) {
  const Tensor &dy = *c.in[0], &q = *c.in[1], &k = *c.in[2], &v = *c.in[3], &att = *c.in[4];
  dispatch_float(q, [&]<typename F>() {
    run_multi_grad<F>(c, 3, [&](const std::vector<F*>& g, bool acc) {
      cpu::gqa_attention_backward<F>(dy.data<F>(), q.data<F>(), k.data<F>(), v.data<F>(),
                                     att.data<F>(), g[0], g[1], g[2], acc, q.size(0), q.size(1),
                                     heads_of(q, c.op), heads_of(k, c.op),
                                     c.op.attrs.i("head_dim"));
    });
  });
}
void bwd_gqa_attention(Autodiff& ad, const Op& f) {
  ad.emit(f, "gqa_attention.bwd",
          {ad.grad(f.outputs[0]), f.inputs[0], f.inputs[1], f.inputs[2], f.outputs[1]},
          {f.inputs[0], f.inputs[1], f.inputs[2]}, f.attrs);
}

}  // namespace weft::core::ops
