// The synthetic transformer step: schedule, per-layer forward/backward allocations, MoE
// routing, optimizer; see synthetic_trace.h for the model.
#include "memory/synthetic_trace.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "base/check.h"

namespace weft::memory {

namespace {
void require(bool ok, const char* field, const std::string& message) {
  if (!ok) throw ConfigError(field, message);
}
}  // namespace

std::vector<Microstep> pipeline_schedule(const StepModel& m) {
  const int M = m.micro_batches, P = m.stages, V = m.virtual_stages, s = m.stage;
  require(M > 0 && P > 0 && V > 0 && s >= 0 && s < P, "parallel",
          str("bad pipeline shape M=", M, " P=", P, " V=", V, " stage=", s));
  std::vector<Microstep> out;
  if (m.schedule == Schedule::kSequential) {
    for (int mb = 0; mb < M; ++mb) {
      for (int c = 0; c < V; ++c) out.push_back({true, mb, c});
      for (int c = V - 1; c >= 0; --c) out.push_back({false, mb, c});
    }
    return out;
  }
  if (m.schedule == Schedule::k1F1B) {
    require(V == 1, "parallel.virtual_stages", "1F1B runs one chunk per stage");
    int warm = std::min(P - s - 1, M);
    for (int i = 0; i < warm; ++i) out.push_back({true, i, 0});
    for (int i = 0; i < M - warm; ++i) {
      out.push_back({true, warm + i, 0});
      out.push_back({false, i, 0});
    }
    for (int i = M - warm; i < M; ++i) out.push_back({false, i, 0});
    return out;
  }
  require(
      M % P == 0, "parallel.micro_batches",
      str("the interleaved schedule needs micro-batches (", M, ") divisible by stages (", P, ")"));
  const int total = M * V;
  const int warm = std::min((P - s - 1) * 2 + (V - 1) * P, total);
  auto step = [&](int k, bool forward) {
    int in_group = k % (P * V);
    int chunk = in_group / P;
    return Microstep{forward, (k / (P * V)) * P + k % P, forward ? chunk : V - 1 - chunk};
  };
  for (int k = 0; k < warm; ++k) out.push_back(step(k, true));
  for (int i = 0; i < total - warm; ++i) {
    out.push_back(step(warm + i, true));
    out.push_back(step(i, false));
  }
  for (int i = total - warm; i < total; ++i) out.push_back(step(i, false));
  return out;
}

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Saved {
  size_t id;
  uint64_t bytes;
  Tag tag;
  bool has_grad;  // masks, statistics and routing indices get no gradient
  bool dynamic;   // an expert's tensor: size and presence depend on routing
};

class StepWriter {
 public:
  StepWriter(const StepModel& m, uint64_t seed) : m_(m), seed_(seed) {
    tok_ = m.batch * m.seq;
    lpc_ = m.layers / m.virtual_stages;
    require(m.layers > 0 && m.virtual_stages > 0 && m.layers % m.virtual_stages == 0,
            "model.layers",
            str(m.layers, " layers do not split into ", m.virtual_stages, " chunks"));
    require(m.experts == 0 || (m.top_k > 0 && m.top_k <= m.experts), "model.moe.top_k",
            str("top_k ", m.top_k, " must be in 1..experts (", m.experts, ")"));
    eff_ = m.expert_ffn > 0 ? m.expert_ffn : m.ffn / std::max(1, m.top_k);
  }

  Trace run() {
    for (const Microstep& ms : pipeline_schedule(m_)) {
      phase_ = ms.forward ? Phase::kForward : Phase::kBackward;
      mb_ = ms.micro_batch;
      b_.set_phase(phase_, mb_);
      if (ms.forward)
        forward_chunk(ms.micro_batch, ms.chunk);
      else
        backward_chunk(ms.micro_batch, ms.chunk);
    }
    if (m_.optimizer) {
      phase_ = Phase::kOptimizer;
      mb_ = -1;
      optimizer();
    }
    return b_.take();
  }

 private:
  uint64_t act(int64_t width) const { return uint64_t(tok_ * width * m_.bytes_per_elem); }
  size_t alloc(uint64_t bytes, Tag tag) { return b_.alloc(bytes, tag); }
  void save(std::vector<Saved>& v, uint64_t bytes, Tag tag = Tag::kActivation, bool grad = true,
            bool dynamic = false) {
    v.push_back({alloc(bytes, tag), bytes, tag, grad, dynamic});
  }
  // A new span with the same phase: how an executor fences the routing-dependent part
  // of an MoE layer, so that planned allocation matching resynchronises after it.
  void fence() { b_.set_phase(phase_, mb_); }
  void workspace() { b_.free(alloc(uint64_t(m_.workspace_bytes), Tag::kWorkspace)); }
  bool first_chunk(int c) const { return m_.stage == 0 && c == 0; }
  bool last_chunk(int c) const { return m_.stage == m_.stages - 1 && c == m_.virtual_stages - 1; }

  // Tokens per expert for one MoE layer: log-normal weights, rounded, summing to tok*k.
  std::vector<int64_t> route(int mb, int chunk, int layer) const {
    uint64_t h = splitmix(
        seed_ ^ splitmix(uint64_t(mb) * 1000003 + uint64_t(chunk) * 7919 + uint64_t(layer)));
    std::vector<double> w(size_t(m_.experts));
    double sum = 0;
    for (double& x : w) {
      h = splitmix(h);
      double u1 = (double(h >> 11) + 0.5) / 9007199254740992.0;
      h = splitmix(h);
      double u2 = double(h >> 11) / 9007199254740992.0;
      double g = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      x = std::exp(m_.routing_skew * g);
      sum += x;
    }
    int64_t total = tok_ * m_.top_k, given = 0;
    std::vector<int64_t> n(w.size());
    for (size_t e = 0; e < w.size(); ++e) given += n[e] = int64_t(double(total) * w[e] / sum);
    for (size_t e = 0; given < total; e = (e + 1) % n.size(), ++given) n[e]++;
    return n;
  }

  // One layer's forward; returns what it saved, and the output in *out.
  std::vector<Saved> forward_layer(int mb, int chunk, int layer, size_t* out) {
    const StepModel& m = m_;
    std::vector<Saved> v;
    save(v, uint64_t(tok_) * 8, Tag::kActivation, false);  // LN1 mean, rstd
    save(v, act(m.hidden));                                // LN1 output
    workspace();
    save(v, act(3 * m.hidden));  // QKV
    if (m.flash_attention) {
      save(v, uint64_t(m.batch * m.heads * m.seq) * 4, Tag::kActivation, false);  // LSE
    } else {
      uint64_t scores = uint64_t(m.batch * m.heads * m.seq * m.seq);
      size_t raw = alloc(scores * m.bytes_per_elem, Tag::kActivation);
      save(v, scores * m.bytes_per_elem);        // probabilities
      save(v, scores, Tag::kActivation, false);  // dropout mask
      b_.free(raw);
    }
    save(v, act(m.hidden));  // context
    workspace();
    size_t proj = alloc(act(m.hidden), Tag::kActivation);
    save(v, uint64_t(tok_ * m.hidden), Tag::kActivation, false);  // dropout mask
    save(v, act(m.hidden));                                       // residual
    b_.free(proj);
    save(v, uint64_t(tok_) * 8, Tag::kActivation, false);  // LN2 mean, rstd
    save(v, act(m.hidden));                                // LN2 output
    if (m.experts == 0) {
      workspace();
      save(v, act(m.ffn));  // FC1
      save(v, act(m.ffn));  // GELU
      workspace();
      size_t fc2 = alloc(act(m.hidden), Tag::kActivation);
      save(v, uint64_t(tok_ * m.hidden), Tag::kActivation, false);
      *out = alloc(act(m.hidden), Tag::kActivation);
      b_.free(fc2);
      return v;
    }
    save(v, uint64_t(tok_ * m.experts) * 4);                         // router logits
    save(v, uint64_t(tok_ * m.top_k) * 8, Tag::kActivation, false);  // routing
    save(v, act(m.top_k * m.hidden), Tag::kComm);                    // dispatched tokens
    std::vector<size_t> expert_out;
    fence();
    for (int64_t n : route(mb, chunk, layer)) {
      if (n == 0) continue;
      uint64_t fc = uint64_t(n * eff_ * m.bytes_per_elem);
      save(v, fc, Tag::kActivation, true, true);  // expert FC1
      save(v, fc, Tag::kActivation, true, true);  // expert GELU
      expert_out.push_back(alloc(uint64_t(n * m.hidden * m.bytes_per_elem), Tag::kActivation));
    }
    fence();
    size_t combine = alloc(act(m.top_k * m.hidden), Tag::kComm);
    for (size_t id : expert_out) b_.free(id);
    save(v, uint64_t(tok_ * m.hidden), Tag::kActivation, false);
    *out = alloc(act(m.hidden), Tag::kActivation);
    b_.free(combine);
    return v;
  }

  void forward_chunk(int mb, int chunk) {
    size_t x = alloc(act(m_.hidden), first_chunk(chunk) ? Tag::kActivation : Tag::kComm);
    std::vector<std::vector<Saved>>& saved = saved_[{mb, chunk}];
    std::vector<size_t>& inputs = inputs_[{mb, chunk}];
    saved.clear();
    inputs.clear();
    for (int l = 0; l < lpc_; ++l) {
      inputs.push_back(x);
      size_t y;
      std::vector<Saved> v = forward_layer(mb, chunk, l, &y);
      if (m_.recompute) {
        for (const Saved& s : v) b_.free(s.id);
        v.clear();
      }
      saved.push_back(std::move(v));
      x = y;
    }
    if (last_chunk(chunk))
      b_.free(alloc(uint64_t(tok_ * m_.vocab * m_.bytes_per_elem), Tag::kActivation));
    b_.free(x);  // sent to the next stage, or consumed by the loss
  }

  void weight_grads(int chunk, int layer) {
    int global = chunk * lpc_ + layer;
    if (grads_done_.count(global)) return;
    grads_done_[global] = true;
    const int64_t C = m_.hidden, g = m_.grad_bytes;
    auto grad = [&](int64_t elems) {
      grads_.push_back(
          {alloc(uint64_t(elems * g), Tag::kGradient), uint64_t(elems * g), Tag::kGradient, false});
    };
    grad(2 * C);  // LN1
    grad(3 * C * C);
    grad(3 * C);  // QKV
    grad(C * C);
    grad(C);      // projection
    grad(2 * C);  // LN2
    if (m_.experts == 0) {
      grad(C * m_.ffn);
      grad(m_.ffn);
      grad(m_.ffn * C);
      grad(C);
    } else {
      grad(C * m_.experts);  // router
      for (int e = 0; e < m_.experts; ++e) {
        grad(C * eff_);
        grad(eff_ * C);
      }
    }
  }

  void backward_chunk(int mb, int chunk) {
    std::vector<std::vector<Saved>>& saved = saved_[{mb, chunk}];
    std::vector<size_t>& inputs = inputs_[{mb, chunk}];
    size_t dy = alloc(act(m_.hidden), last_chunk(chunk) ? Tag::kActivation : Tag::kComm);
    for (int l = lpc_ - 1; l >= 0; --l) {
      std::vector<Saved> v = std::move(saved[size_t(l)]);
      if (m_.recompute) {
        size_t y;
        v = forward_layer(mb, chunk, l, &y);
        b_.free(y);
      }
      weight_grads(chunk, l);
      size_t grad = dy;
      bool in_experts = false;
      for (auto it = v.rbegin(); it != v.rend(); ++it) {
        if (it->dynamic != in_experts) {
          in_experts = it->dynamic;
          fence();
        }
        if (it->has_grad) {
          size_t g = alloc(it->bytes, it->tag);
          b_.free(grad);
          grad = g;
        }
        b_.free(it->id);
      }
      dy = alloc(act(m_.hidden), Tag::kActivation);  // gradient of the layer input
      b_.free(grad);
      b_.free(inputs[size_t(l)]);
    }
    b_.free(dy);  // sent to the previous stage, or into the embedding's gradient
    saved_.erase({mb, chunk});
    inputs_.erase({mb, chunk});
  }

  void optimizer() {
    b_.set_phase(Phase::kOptimizer, -1);
    b_.free(alloc(4096, Tag::kComm));  // grad-norm all-reduce
    for (const Saved& g : grads_) {
      b_.free(alloc(g.bytes, Tag::kOptimizer));
      b_.free(g.id);
    }
    grads_.clear();
  }

  const StepModel& m_;
  uint64_t seed_;
  Phase phase_ = Phase::kOther;
  int mb_ = -1;
  int64_t tok_;
  int lpc_;
  int64_t eff_;
  TraceBuilder b_;
  std::map<std::pair<int, int>, std::vector<std::vector<Saved>>> saved_;
  std::map<std::pair<int, int>, std::vector<size_t>> inputs_;
  std::map<int, bool> grads_done_;
  std::vector<Saved> grads_;
};

}  // namespace

Trace synthesize_step(const StepModel& m, uint64_t seed) { return StepWriter(m, seed).run(); }

}  // namespace weft::memory
