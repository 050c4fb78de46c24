// CUDA bindings of the op table. Each reads its shapes exactly as the CPU binding in
// core/graph/ops_*.cc does and calls the kernel of kernels.h with the same flags; the
// mixed-precision storage is described in ops_cuda.h.
#include "core/cuda/ops_cuda.h"

#include <algorithm>

#include "base/check.h"
#include "base/env.h"
#include "core/cuda/kernels.h"
#include "core/cuda/transfer.h"

namespace weft::core::cuda {
namespace {

int64_t rows(const Tensor& t) { return t.numel() / t.size(-1); }

// Output k of a backward op, or nullptr when autodiff skipped it (as ops_dense.cc).
Tensor* out_or_null(CudaOpContext& c, int k) {
  int idx = 0;
  for (int j = 0; j < k; ++j)
    if (!c.op.attrs.i_or("skip_out" + std::to_string(j), 0)) idx++;
  if (c.op.attrs.i_or("skip_out" + std::to_string(k), 0)) return nullptr;
  return c.out.at(idx);
}
bool acc_of(CudaOpContext& c, int k) {
  int idx = 0;
  for (int j = 0; j < k; ++j)
    if (!c.op.attrs.i_or("skip_out" + std::to_string(j), 0)) idx++;
  return c.op.accumulate.at(idx);
}

// Typed pointers that check the storage rule of ops_cuda.h (a mismatch is a bug).
const bf16* cb(const Tensor* t) { return t ? t->data<bf16>() : nullptr; }
bf16* mb(Tensor* t) { return t ? t->data<bf16>() : nullptr; }
float* mf(Tensor* t) { return t ? t->data<float>() : nullptr; }
const int32_t* ids(const Tensor* t) { return t->data<int32_t>(); }

// ---- embedding ------------------------------------------------------------------------
void run_embedding(CudaOpContext& c) {
  const Tensor &tok = *c.in[0], &wte = *c.in[1];
  embedding_forward(ids(&tok), cb(c.in[1]), c.in.size() > 2 ? cb(c.in[2]) : nullptr, mb(c.out[0]),
                    tok.size(0), tok.size(1), wte.size(1), c.env.stream);
}
void run_embedding_bwd(CudaOpContext& c) {
  const Tensor &dx = *c.in[0], &tok = *c.in[1];
  Tensor* dwpe = c.op.attrs.i_or("has_wpe", 1) ? out_or_null(c, 1) : nullptr;  // Llama: no wpe
  embedding_backward(cb(&dx), ids(&tok), mf(out_or_null(c, 0)), mf(dwpe), tok.size(0), tok.size(1),
                     dx.size(-1), c.env.stream);
}

// ---- layernorm -------------------------------------------------------------------------
void run_layernorm(CudaOpContext& c) {
  const Tensor& x = *c.in[0];
  layernorm_forward(cb(&x), cb(c.in[1]), cb(c.in[2]), mb(c.out[0]), mf(c.out[1]), mf(c.out[2]),
                    rows(x), x.size(-1), float(c.op.attrs.f("eps")), c.env.stream);
}
void run_layernorm_bwd(CudaOpContext& c) {
  const Tensor& x = *c.in[1];
  const int64_t C = x.size(-1), N = rows(x);
  Tensor* dx = out_or_null(c, 0);
  Tensor ws = c.scratch({int64_t(layernorm_backward_workspace(N, C))}, DType::kF32);
  layernorm_backward(cb(c.in[0]), cb(&x), cb(c.in[2]), c.in[3]->data<float>(),
                     c.in[4]->data<float>(), mb(dx), dx && acc_of(c, 0), mf(out_or_null(c, 1)),
                     mf(out_or_null(c, 2)), N, C, ws.data<float>(), c.env.stream);
}

// ---- linear / matmul: y(N,out) = x(N,in) w(out,in)^T [+ b] -----------------------------
void run_linear(CudaOpContext& c) {
  const Tensor &x = *c.in[0], &w = *c.in[1];
  const Tensor* b = c.in.size() > 2 ? c.in[2] : nullptr;
  const int64_t N = rows(x), in = w.size(1), out = w.size(0);
  GemmArgs g;
  g.trans_b = true;
  g.M = N, g.N = out, g.K = in;
  g.A = cb(&x), g.lda = in;
  g.B = cb(&w), g.ldb = in;
  g.C = mb(c.out[0]), g.ldc = out;
  if (b) {
    g.epilogue = Epilogue::kBias;
    g.bias = cb(b);
  }
  c.env.blas->gemm(g, c.env.stream);
}
void run_linear_bwd(CudaOpContext& c) {
  const Tensor &dy = *c.in[0], &x = *c.in[1], &w = *c.in[2];
  const int64_t N = rows(x), in = w.size(1), out = w.size(0);
  Tensor* dx = out_or_null(c, 0);
  Tensor* dw = out_or_null(c, 1);
  Tensor* db = c.op.attrs.i("has_bias") ? out_or_null(c, 2) : nullptr;
  WEFT_CHECK(dw, "linear.bwd without a weight gradient");
  if (dx) {  // dx(N,in) = dy(N,out) w(out,in)
    GemmArgs g;
    g.M = N, g.N = in, g.K = out;
    g.A = cb(&dy), g.lda = out;
    g.B = cb(&w), g.ldb = in;
    g.beta = acc_of(c, 0) ? 1.0f : 0.0f;
    g.C = mb(dx), g.ldc = in;
    c.env.blas->gemm(g, c.env.stream);
  }
  {  // dw(out,in) += dy^T x, in f32
    GemmArgs g;
    g.trans_a = true;
    g.M = out, g.N = in, g.K = N;
    g.A = cb(&dy), g.lda = out;
    g.B = cb(&x), g.ldb = in;
    g.beta = 1.0f;
    g.C = mf(dw), g.c_f32 = true, g.ldc = in;
    c.env.blas->gemm(g, c.env.stream);
  }
  if (db) {
    Tensor ws = c.scratch({int64_t(column_sum_workspace(N, out))}, DType::kF32);
    column_sum(cb(&dy), N, out, mf(db), ws.data<float>(), c.env.stream);
  }
}

// ---- gelu, add -------------------------------------------------------------------------
void run_gelu(CudaOpContext& c) {
  gelu_forward(cb(c.in[0]), mb(c.out[0]), c.in[0]->numel(), c.env.stream);
}
void run_gelu_bwd(CudaOpContext& c) {
  gelu_backward(cb(c.in[0]), cb(c.in[1]), mb(c.out[0]), c.accumulate(0), c.in[0]->numel(),
                c.env.stream);
}
void run_add(CudaOpContext& c) {
  add(cb(c.in[0]), cb(c.in[1]), mb(c.out[0]), c.in[0]->numel(), c.env.stream);
}
void run_add_bwd(CudaOpContext& c) {
  const Tensor& dy = *c.in[0];
  for (size_t k = 0; k < c.out.size(); ++k) {
    if (c.accumulate(k))
      accumulate(cb(&dy), mb(c.out[k]), dy.numel(), c.env.stream);
    else
      copy_device(dy, *c.out[k], c.env.stream);
  }
}

// ---- attention: saved state per the chosen implementation (device_layout) -------------
void run_attention(CudaOpContext& c) {
  const Tensor& qkv = *c.in[0];
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = c.op.attrs.i("heads");
  if (c.env.attention == AttentionImpl::kFlash) {
    attention_forward(cb(&qkv), mb(c.out[0]), mf(c.out[1]), B, T, C, H, c.env.stream);
    return;
  }
  Tensor scores = c.scratch({int64_t(attention_gemm_workspace(T, H))}, DType::kF32);
  attention_gemm_forward(*c.env.blas, cb(&qkv), mb(c.out[0]), mb(c.out[1]), scores.data<float>(), B,
                         T, C, H, c.env.stream);
}
void run_attention_bwd(CudaOpContext& c) {
  const Tensor& qkv = *c.in[1];
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = c.op.attrs.i("heads");
  if (c.env.attention == AttentionImpl::kFlash) {
    Tensor ws = c.scratch({int64_t(attention_backward_workspace(B, T, H))}, DType::kF32);
    attention_backward(cb(c.in[0]), cb(&qkv), c.in[2]->data<float>(), mb(c.out[0]), c.accumulate(0),
                       ws.data<float>(), B, T, C, H, c.env.stream);
    return;
  }
  Tensor dscores = c.scratch({int64_t(attention_gemm_workspace(T, H))}, DType::kF32);
  Tensor ds = c.scratch({H, T, T}, DType::kBF16);
  attention_gemm_backward(*c.env.blas, cb(c.in[0]), cb(&qkv), cb(c.in[2]), mb(c.out[0]),
                          c.accumulate(0), dscores.data<float>(), mb(&ds), B, T, C, H,
                          c.env.stream);
}

// ---- the Llama block (as core/graph/ops_llama.cc) ----------------------------------------
int64_t heads_of(const Tensor& x, const Op& op) {
  const int64_t hd = op.attrs.i("head_dim");
  WEFT_CHECK(hd > 0 && x.size(-1) % hd == 0, op.type, ": width ", x.size(-1),
             " is not whole heads of ", hd);
  return x.size(-1) / hd;
}
// Backward kernels that write several gradients take one accumulate flag: with mixed flags
// they write bf16 scratch, then each is added to or copied into its output.
template <typename Kernel>
void run_multi_grad(CudaOpContext& c, int n, Kernel&& kernel) {
  std::vector<Tensor*> outs;
  bool same = true;
  for (int k = 0; k < n; ++k) {
    Tensor* t = out_or_null(c, k);
    WEFT_CHECK(t, c.op.type, ": gradient ", k, " was skipped, but the kernel writes all ", n);
    outs.push_back(t);
    same = same && acc_of(c, k) == acc_of(c, 0);
  }
  std::vector<Tensor> tmp;
  std::vector<bf16*> p;
  for (Tensor* t : outs) {
    if (same) {
      p.push_back(mb(t));
      continue;
    }
    tmp.push_back(c.scratch(t->shape(), DType::kBF16));
    p.push_back(mb(&tmp.back()));
  }
  kernel(p, same && acc_of(c, 0));
  if (same) return;
  for (int k = 0; k < n; ++k) {
    if (acc_of(c, k)) accumulate(cb(&tmp[size_t(k)]), mb(outs[size_t(k)]), tmp[size_t(k)].numel(), c.env.stream);
    else copy_device(tmp[size_t(k)], *outs[size_t(k)], c.env.stream);
  }
}

void run_rmsnorm(CudaOpContext& c) {
  const Tensor& x = *c.in[0];
  rmsnorm_forward(cb(&x), cb(c.in[1]), mb(c.out[0]), mf(c.out[1]), rows(x), x.size(-1),
                  float(c.op.attrs.f("eps")), c.env.stream);
}
void run_rmsnorm_bwd(CudaOpContext& c) {
  const Tensor& x = *c.in[1];
  const int64_t C = x.size(-1), N = rows(x);
  Tensor* dx = out_or_null(c, 0);
  Tensor ws = c.scratch({int64_t(rmsnorm_backward_workspace(N, C))}, DType::kF32);
  rmsnorm_backward(cb(c.in[0]), cb(&x), cb(c.in[2]), c.in[3]->data<float>(), mb(dx),
                   dx && acc_of(c, 0), mf(out_or_null(c, 1)), N, C, ws.data<float>(), c.env.stream);
}
void run_rope(CudaOpContext& c) {
  const Tensor& x = *c.in[0];
  rope_forward(cb(&x), mb(c.out[0]), x.size(0), x.size(1), heads_of(x, c.op),
               c.op.attrs.i("head_dim"), c.op.attrs.f("theta"), c.env.stream);
}
void run_rope_bwd(CudaOpContext& c) {
  const Tensor& dy = *c.in[0];
  rope_backward(cb(&dy), mb(c.out[0]), c.accumulate(0), dy.size(0), dy.size(1), heads_of(dy, c.op),
                c.op.attrs.i("head_dim"), c.op.attrs.f("theta"), c.env.stream);
}
void run_swiglu(CudaOpContext& c) {
  swiglu_forward(cb(c.in[0]), cb(c.in[1]), mb(c.out[0]), c.in[0]->numel(), c.env.stream);
}
void run_swiglu_bwd(CudaOpContext& c) {
  const Tensor& dy = *c.in[0];
  run_multi_grad(c, 2, [&](const std::vector<bf16*>& g, bool acc) {
    swiglu_backward(cb(&dy), cb(c.in[1]), cb(c.in[2]), g[0], g[1], acc, dy.numel(), c.env.stream);
  });
}
// Grouped-query attention always takes the cuBLASLt path (the flash kernel reads GPT's qkv).
void run_gqa_attention(CudaOpContext& c) {
  const Tensor &q = *c.in[0], &k = *c.in[1];
  const int64_t H = heads_of(q, c.op), T = q.size(1);
  Tensor scores = c.scratch({int64_t(attention_gemm_workspace(T, H))}, DType::kF32);
  gqa_attention_gemm_forward(*c.env.blas, cb(&q), cb(&k), cb(c.in[2]), mb(c.out[0]), mb(c.out[1]),
                             scores.data<float>(), q.size(0), T, H, heads_of(k, c.op),
                             c.op.attrs.i("head_dim"), c.env.stream);
}
void run_gqa_attention_bwd(CudaOpContext& c) {
  const Tensor &q = *c.in[1], &k = *c.in[2];
  const int64_t H = heads_of(q, c.op), T = q.size(1);
  Tensor dscores = c.scratch({int64_t(attention_gemm_workspace(T, H))}, DType::kF32);
  Tensor ds = c.scratch({H, T, T}, DType::kBF16);
  run_multi_grad(c, 3, [&](const std::vector<bf16*>& g, bool acc) {
    gqa_attention_gemm_backward(*c.env.blas, cb(c.in[0]), cb(&q), cb(&k), cb(c.in[3]), cb(c.in[4]),
                                g[0], g[1], g[2], acc, dscores.data<float>(), mb(&ds), q.size(0), T, H,
                                heads_of(k, c.op), c.op.attrs.i("head_dim"), c.env.stream);
  });
}

// ---- cross-entropy (mean over the B*T rows of the micro-batch) ---------------------------
void run_cross_entropy(CudaOpContext& c) {
  const Tensor &logits = *c.in[0], &tgt = *c.in[1];
  const int64_t V = logits.size(-1), N = rows(logits);
  Tensor losses = c.scratch({N}, DType::kF32);
  cross_entropy_forward(cb(&logits), ids(&tgt), losses.data<float>(), mb(c.out[1]), mf(c.out[0]), N,
                        V, c.env.stream);
}
void run_cross_entropy_bwd(CudaOpContext& c) {
  const Tensor& probs = *c.in[0];
  const int64_t V = probs.size(-1), N = rows(probs);
  // d(objective)/d(row loss) = loss_scale / N, as the CPU binding.
  cross_entropy_backward(cb(&probs), ids(c.in[1]), float(c.scalars.loss_scale / double(N)),
                         mb(c.out[0]), c.accumulate(0), N, V, c.env.stream);
}

// ---- optimizer -------------------------------------------------------------------------
void run_global_norm(CudaOpContext& c) {
  std::vector<const float*> ptrs;
  std::vector<int64_t> sizes;
  for (Tensor* g : c.in) {
    ptrs.push_back(g->data<float>());
    sizes.push_back(g->numel());
  }
  Tensor ws = c.scratch({int64_t(sum_squares_workspace(sizes))}, DType::kF64);
  global_norm(ptrs, sizes, c.out[0]->data<double>(), ws.data<double>(), c.env.stream);
}
void run_adamw(CudaOpContext& c) { run_adamw_group({&c}); }

// ---- ops without a CUDA kernel: the CPU binding on host copies ------------------------
// The MoE layer's routing (top-k, capacity, dispatch) is data-dependent host logic in
// core/graph/ops_moe.cc; until it has kernels it runs there, exactly, on f32 copies.
// Correct and slow: every call synchronises the stream and copies its operands both ways.
DType host_dtype(DType d) { return d == DType::kBF16 ? DType::kF32 : d; }
void run_on_host(CudaOpContext& c) {
  std::vector<Tensor> hin, hout;
  std::vector<Tensor*> pin, pout;
  for (Tensor* t : c.in) hin.push_back(to_host(*t, host_dtype(t->dtype()), c.env.stream));
  for (size_t k = 0; k < c.out.size(); ++k) {
    const Tensor& d = *c.out[k];
    hout.push_back(c.accumulate(k) ? to_host(d, host_dtype(d.dtype()), c.env.stream)
                                   : Tensor::empty(d.shape(), host_dtype(d.dtype())));
  }
  for (Tensor& t : hin) pin.push_back(&t);
  for (Tensor& t : hout) pout.push_back(&t);
  OpContext hc{c.op, pin, pout, c.scalars, &memory::default_host_allocator()};
  op_def(c.op.type).run_cpu(hc);
  for (size_t k = 0; k < c.out.size(); ++k) upload(hout[k], *c.out[k], c.env.stream);
}

}  // namespace

Tensor CudaOpContext::scratch(const Shape& shape, DType dtype) const {
  return Tensor::empty_on(env.device, shape, dtype, *workspace, memory::Tag::kWorkspace);
}

const std::vector<CudaOpDef>& all_cuda_op_defs() {
  static const std::vector<CudaOpDef> table = {
      {"embedding", run_embedding},
      {"embedding.bwd", run_embedding_bwd},
      {"layernorm", run_layernorm},
      {"layernorm.bwd", run_layernorm_bwd},
      {"linear", run_linear},
      {"linear.bwd", run_linear_bwd},
      {"matmul", run_linear},
      {"matmul.bwd", run_linear_bwd},
      {"gelu", run_gelu},
      {"gelu.bwd", run_gelu_bwd},
      {"add", run_add},
      {"add.bwd", run_add_bwd},
      {"attention", run_attention},
      {"attention.bwd", run_attention_bwd},
      {"rmsnorm", run_rmsnorm},
      {"rmsnorm.bwd", run_rmsnorm_bwd},
      {"rope", run_rope},
      {"rope.bwd", run_rope_bwd},
      {"swiglu", run_swiglu},
      {"swiglu.bwd", run_swiglu_bwd},
      {"gqa_attention", run_gqa_attention},
      {"gqa_attention.bwd", run_gqa_attention_bwd},
      {"cross_entropy", run_cross_entropy},
      {"cross_entropy.bwd", run_cross_entropy_bwd},
      {"moe", run_on_host, true},
      {"moe.bwd", run_on_host, true},
      {"global_norm", run_global_norm},
      {"adamw", run_adamw},
  };
  return table;
}

const CudaOpDef& cuda_op_def(const std::string& type) {
  for (const CudaOpDef& d : all_cuda_op_defs())
    if (d.type == type) return d;
  throw InternalError("no CUDA binding for op type '" + type + "'");
}

AttentionImpl attention_impl_from_env() {
  std::string v = env_string("WEFT_CUDA_ATTENTION", "gemm");
  WEFT_CHECK(v == "gemm" || v == "flash", "WEFT_CUDA_ATTENTION=", v, ": use gemm or flash");
  return v == "flash" ? AttentionImpl::kFlash : AttentionImpl::kGemm;
}

DeviceLayout device_layout(const Graph& g, const Op& op, size_t k, AttentionImpl attention) {
  const Value& v = g.value(op.outputs.at(k));
  if (op.type == "attention" && k == 1 && attention == AttentionImpl::kFlash)
    return {{v.shape.at(0), v.shape.at(1), v.shape.at(2)}, DType::kF32};  // log-sum-exp
  if (op.type == "layernorm" && k >= 1) return {v.shape, DType::kF32};    // mean, rstd
  if (op.type == "rmsnorm" && k == 1) return {v.shape, DType::kF32};      // rstd
  if (v.persistent || v.role == Role::kScalar) return {v.shape, v.dtype};
  if (v.dtype == DType::kF32) return {v.shape, DType::kBF16};
  return {v.shape, v.dtype};
}

void run_adamw_group(const std::vector<CudaOpContext*>& ops) {
  if (ops.empty()) return;
  CudaOpContext& first = *ops.front();
  const Attrs& a0 = first.op.attrs;
  AdamWHyper hp{first.scalars.lr,     a0.f("beta1"),     a0.f("beta2"),         a0.f("eps"),
                a0.f("weight_decay"), a0.f("grad_clip"), first.scalars.step + 1};
  const Tensor* norm = first.in.at(4);
  std::vector<AdamWTensor> list;
  for (CudaOpContext* c : ops) {
    const Attrs& a = c->op.attrs;
    // One launch shares its hyperparameters and norm; the executor groups accordingly.
    WEFT_CHECK(a.f("beta1") == hp.beta1 && a.f("beta2") == hp.beta2 && a.f("eps") == hp.eps &&
                   a.f("weight_decay") == hp.weight_decay && a.f("grad_clip") == hp.grad_clip &&
                   c->in.at(4) == norm,
               "run_adamw_group: ops with different hyperparameters in one group");
    Tensor &p = *c->in[0], &g = *c->in[1], &m = *c->in[2], &v = *c->in[3];
    Tensor* copy = c->compute_copy.size() > 0 ? c->compute_copy[0] : nullptr;
    list.push_back({p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(),
                    copy ? copy->data<bf16>() : nullptr, p.numel(), a.i("decay") != 0});
  }
  adamw_multi(list, hp, norm->data<double>(), first.env.stream);
}

}  // namespace weft::core::cuda
