// Kernel bindings and backward builders of the dense transformer ops.
// Shapes: B batch, T sequence, C channels, H heads, V vocabulary, N = B*T rows.
#include "base/check.h"
#include "core/cpu/kernels.h"
#include "core/graph/op_bind.h"
#include "core/graph/op_impls.h"

namespace weft::core::ops {
using namespace bind;

// ---- embedding (wpe optional: inputs tokens, wte[, wpe]; Llama has no position table) ----
void run_embedding(OpContext& c) {
  const Tensor &tok = *c.in[0], &wte = *c.in[1];
  const Tensor* wpe = c.in.size() > 2 ? c.in[2] : nullptr;
  int64_t B = tok.size(0), T = tok.size(1), C = wte.size(1), V = wte.size(0);
  dispatch_float(wte, [&]<typename F>() {
    if (wpe) {
      cpu::embedding_forward<F>(tok.data<int32_t>(), wte.data<F>(), wpe->data<F>(),
                                c.out[0]->data<F>(), B, T, C, V);
      return;
    }
    // The slice kernel over the whole table; it leaves ids >= V at zero, so check them here.
    const int32_t* ids = tok.data<int32_t>();
    for (int64_t i = 0; i < tok.numel(); ++i)
      WEFT_CHECK(ids[i] >= 0 && ids[i] < V, "token id ", ids[i], " at position ", i,
                 " is outside the vocabulary [0, ", V, ")");
    cpu::embedding_slice_forward<F>(ids, wte.data<F>(), nullptr, c.out[0]->data<F>(), B, T, C, V, 0);
  });
}
void run_embedding_bwd(OpContext& c) {
  const Tensor &dx = *c.in[0], &tok = *c.in[1];
  int64_t B = tok.size(0), T = tok.size(1), C = dx.size(-1);
  Tensor* dwte = out_or_null(c, 0);
  Tensor* dwpe = c.op.attrs.i_or("has_wpe", 1) ? out_or_null(c, 1) : nullptr;
  dispatch_float(dx, [&]<typename F>() {
    cpu::embedding_backward<F>(dx.data<F>(), tok.data<int32_t>(), ptr<F>(dwte), ptr<F>(dwpe), B,
                               T, C);
  });
}
void bwd_embedding(Autodiff& ad, const Op& f) {
  const bool has_wpe = f.inputs.size() > 2;
  std::vector<int> grads = {f.inputs[1]};
  if (has_wpe) grads.push_back(f.inputs[2]);
  Attrs a;
  if (!has_wpe) a.ints["has_wpe"] = 0;
  ad.emit(f, "embedding.bwd", {ad.grad(f.outputs[0]), f.inputs[0]}, grads, a);
}

// ---- layernorm ---------------------------------------------------------------------
void run_layernorm(OpContext& c) {
  const Tensor& x = *c.in[0];
  int64_t C = x.size(-1), N = rows(x);
  dispatch_float(x, [&]<typename F>() {
    cpu::layernorm_forward<F>(x.data<F>(), c.in[1]->data<F>(), c.in[2]->data<F>(),
                              c.out[0]->data<F>(), c.out[1]->data<F>(), c.out[2]->data<F>(), N, C,
                              F(c.op.attrs.f("eps")));
  });
}
void run_layernorm_bwd(OpContext& c) {
  const Tensor &dy = *c.in[0], &x = *c.in[1];
  int64_t C = x.size(-1), N = rows(x);
  Tensor* dx = out_or_null(c, 0);
  dispatch_float(x, [&]<typename F>() {
    cpu::layernorm_backward<F>(dy.data<F>(), x.data<F>(), c.in[2]->data<F>(), c.in[3]->data<F>(),
                               c.in[4]->data<F>(), ptr<F>(dx), dx && acc_of(c, 0),
                               ptr<F>(out_or_null(c, 1)), ptr<F>(out_or_null(c, 2)), N, C);
  });
}
void bwd_layernorm(Autodiff& ad, const Op& f) {
  ad.emit(f, "layernorm.bwd",
          {ad.grad(f.outputs[0]), f.inputs[0], f.inputs[1], f.outputs[1], f.outputs[2]},
          {f.inputs[0], f.inputs[1], f.inputs[2]});
}

// ---- linear (bias optional: inputs x, w[, b]) -------------------------------------
void run_linear(OpContext& c) {
  const Tensor &x = *c.in[0], &w = *c.in[1];
  const Tensor* b = c.in.size() > 2 ? c.in[2] : nullptr;
  dispatch_float(x, [&]<typename F>() {
    cpu::linear_forward<F>(x.data<F>(), w.data<F>(), b ? b->data<F>() : nullptr,
                           c.out[0]->data<F>(), rows(x), w.size(1), w.size(0));
  });
}
void run_linear_bwd(OpContext& c) {
  const Tensor &dy = *c.in[0], &x = *c.in[1], &w = *c.in[2];
  Tensor* dx = out_or_null(c, 0);
  Tensor* dw = out_or_null(c, 1);
  Tensor* db = c.op.attrs.i("has_bias") ? out_or_null(c, 2) : nullptr;
  WEFT_CHECK(dw, "linear.bwd without a weight gradient");
  dispatch_float(x, [&]<typename F>() {
    cpu::linear_backward<F>(dy.data<F>(), x.data<F>(), w.data<F>(), ptr<F>(dx), dx && acc_of(c, 0),
                            dw->data<F>(), ptr<F>(db), rows(x), w.size(1), w.size(0));
  });
}
void bwd_linear(Autodiff& ad, const Op& f) {
  bool has_bias = f.inputs.size() > 2;
  std::vector<int> grads = {f.inputs[0], f.inputs[1]};
  if (has_bias) grads.push_back(f.inputs[2]);
  Attrs a;
  a.ints["has_bias"] = has_bias;
  // linear -> linear.bwd (with or without its bias), matmul (the LM head) -> matmul.bwd.
  ad.emit(f, f.type + ".bwd",
          {ad.grad(f.outputs[0]), f.inputs[0], f.inputs[1]}, grads, a);
}

// ---- gelu ----------------------------------------------------------------------------
void run_gelu(OpContext& c) {
  dispatch_float(*c.in[0], [&]<typename F>() {
    cpu::gelu_forward<F>(c.in[0]->data<F>(), c.out[0]->data<F>(), c.in[0]->numel());
  });
}
void run_gelu_bwd(OpContext& c) {
  dispatch_float(*c.in[0], [&]<typename F>() {
    cpu::gelu_backward<F>(c.in[0]->data<F>(), c.in[1]->data<F>(), c.out[0]->data<F>(),
                          c.accumulate(0), c.in[0]->numel());
  });
}
void bwd_gelu(Autodiff& ad, const Op& f) {
  ad.emit(f, "gelu.bwd", {ad.grad(f.outputs[0]), f.inputs[0]}, {f.inputs[0]});
}

// ---- add (residual) -----------------------------------------------------------------
void run_add(OpContext& c) {
  dispatch_float(*c.in[0], [&]<typename F>() {
    cpu::add<F>(c.in[0]->data<F>(), c.in[1]->data<F>(), c.out[0]->data<F>(), c.in[0]->numel());
  });
}
void run_add_bwd(OpContext& c) {
  const Tensor& dy = *c.in[0];
  for (size_t k = 0; k < c.out.size(); ++k) {
    if (c.accumulate(k)) {
      dispatch_float(dy, [&]<typename F>() {
        cpu::axpy<F>(F(1), dy.data<F>(), c.out[k]->data<F>(), dy.numel());
      });
    } else {
      c.out[k]->copy_from(dy);
    }
  }
}
void bwd_add(Autodiff& ad, const Op& f) {
  ad.emit(f, "add.bwd", {ad.grad(f.outputs[0])}, {f.inputs[0], f.inputs[1]});
}

// ---- causal self-attention ----------------------------------------------------------
void run_attention(OpContext& c) {
  const Tensor& qkv = *c.in[0];
  int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = c.op.attrs.i("heads");
  dispatch_float(qkv, [&]<typename F>() {
    cpu::attention_forward<F>(qkv.data<F>(), c.out[0]->data<F>(), c.out[1]->data<F>(), B, T, C, H);
  });
}
void run_attention_bwd(OpContext& c) {
  const Tensor &dy = *c.in[0], &qkv = *c.in[1], &att = *c.in[2];
  int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = c.op.attrs.i("heads");
  dispatch_float(qkv, [&]<typename F>() {
    cpu::attention_backward<F>(dy.data<F>(), qkv.data<F>(), att.data<F>(), c.out[0]->data<F>(),
                               c.accumulate(0), B, T, C, H);
  });
}
void bwd_attention(Autodiff& ad, const Op& f) {
  Attrs a;
  a.ints["heads"] = f.attrs.i("heads");
  ad.emit(f, "attention.bwd", {ad.grad(f.outputs[0]), f.inputs[0], f.outputs[1]}, {f.inputs[0]}, a);
}

// ---- cross-entropy (mean over the B*T tokens of the micro-batch) -----------------
void run_cross_entropy(OpContext& c) {
  const Tensor &logits = *c.in[0], &tgt = *c.in[1];
  int64_t V = logits.size(-1), N = rows(logits);
  dispatch_float(logits, [&]<typename F>() {
    Tensor losses = Tensor::empty({N}, logits.dtype(), c.workspace, memory::Tag::kWorkspace);
    double mean = cpu::cross_entropy_forward<F>(logits.data<F>(), tgt.data<int32_t>(),
                                                losses.data<F>(), c.out[1]->data<F>(), N, V);
    c.out[0]->fill_(mean);
  });
}
void run_cross_entropy_bwd(OpContext& c) {
  const Tensor &probs = *c.in[0], &tgt = *c.in[1];
  int64_t V = probs.size(-1), N = rows(probs);
  // d(objective)/d(row loss) = loss_scale / N (the loss is a mean over rows).
  dispatch_float(probs, [&]<typename F>() {
    cpu::cross_entropy_backward<F>(probs.data<F>(), tgt.data<int32_t>(),
                                   F(c.scalars.loss_scale / double(N)), c.out[0]->data<F>(),
                                   c.accumulate(0), N, V);
  });
}
void bwd_cross_entropy(Autodiff& ad, const Op& f) {
  ad.emit(f, "cross_entropy.bwd", {f.outputs[1], f.inputs[1]}, {f.inputs[0]});
}

}  // namespace weft::core::ops
