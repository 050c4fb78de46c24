// The closed-form memory estimate: parameter and activation counts per layer as
// core/models/gpt.cc builds them, divided as the plan shards them.
#include "planner/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "base/error.h"
#include "planner/policy.h"

namespace weft::planner {
namespace {

constexpr double kF32 = 4.0;
constexpr double kGiB = double(int64_t(1) << 30);

struct Counts {
  double layer_params = 0;   // one layer's parameters (MoE layers counted where they fall)
  double expert_params = 0;  // of which expert weights (split by ep)
  double embed_params = 0;   // wte, wpe, ln_f
};

// Llama (core/models/llama.cc): q, k, v, o projections without biases, two RMSNorm
// weights and the three SwiGLU matrices per layer; the head unless tied.
Counts count_llama_parameters(const core::ModelSpec& m) {
  const double C = double(m.dim), F = double(m.mlp_width());
  const double kv = double(m.kv()) * (C / double(m.heads));  // KV width
  Counts c;
  c.layer_params = double(m.layers) * (2 * C + 2 * C * C + 2 * C * kv + 3 * F * C);
  c.embed_params = double(m.vocab) * C * (m.tie_embeddings ? 1 : 2) + C;
  return c;
}

// Parameters, from the shapes in core/models/gpt.cc.
Counts count_parameters(const core::ModelSpec& m) {
  if (m.is_llama()) return count_llama_parameters(m);
  const double C = double(m.dim), F = double(m.mlp_ratio) * C, E = double(m.moe.experts);
  const double attn = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C;  // ln_1, qkv, proj, ln_2
  const double mlp = (F * C + F) + (F * C + C);
  const double experts = E * (2 * F * C + F + C);
  Counts c;
  for (int64_t i = 0; i < m.layers; ++i) {
    c.layer_params += attn + (m.is_moe_layer(i) ? E * C + experts : mlp);
    if (m.is_moe_layer(i)) c.expert_params += experts;
  }
  c.embed_params = double(m.vocab) * C + double(m.seq_len) * C + 2 * C;
  return c;
}

// Elements one rank holds, by how tensor parallelism lays them: `split` is cut over the tp
// lanes (heads, MLP columns, vocabulary slices); `whole` is a replica on every lane (the
// norms' inputs, outputs and statistics, the row-parallel outputs, the residual stream)
// unless sequence parallelism cuts it over the sequence.
struct Acts {
  double split = 0, whole = 0;
  double per_rank(double tp, bool sp) const { return split / tp + whole / (sp ? tp : 1.0); }
};

// Values one layer saves for backward for one micro-batch of B sequences, averaged over
// the layers (MoE layers replace the MLP's by the routed tokens').
Acts layer_activations(const core::ModelSpec& m, double B, const std::string& recompute) {
  const double T = double(m.seq_len), C = double(m.dim), F = double(m.mlp_width());
  const double H = double(m.heads), N = B * T;
  // Full recompute keeps only the layer's input: the residual stream.
  if (recompute == "full") return {0, N * C};
  if (m.is_llama()) {
    // Whole: two norms (out, rstd), o_proj and down (row-parallel outputs), two residuals.
    // Split: q, k, v, rotated q and k, attention out, probs (B,H,T,T), gate, up, swiglu.
    const double kv = double(m.kv()) * (C / H);
    const double probs = B * H * T * T;
    Acts a{N * (C + 2 * kv) + N * (C + kv) + N * C + probs + 3 * N * F,
           2 * N * (C + 1) + 4 * N * C};
    if (recompute == "selective") a.split -= probs + N * C;  // attention is recomputed
    return a;
  }
  // Whole: ln_1 and ln_2 (out, mean, rstd), the attention and MLP projections, res_1, res_2.
  // Split: qkv, attention out, probs, fc, gelu.
  const double probs = B * H * T * T;
  const double k = double(m.moe.top_k), E = double(m.moe.experts);
  // out (whole); router probs, route, xe/ye, he counted with the split part as before.
  const double moe = N * E + N * k * 2 + N * k * (2 * C + F);
  Acts sum;
  for (int64_t i = 0; i < m.layers; ++i) {
    Acts layer{3 * N * C + N * C + probs, 2 * N * (C + 2) + 3 * N * C};
    if (m.is_moe_layer(i))
      layer.split += moe, layer.whole += N * C;
    else
      layer.split += 2 * N * F, layer.whole += N * C;
    if (recompute == "selective") layer.split -= probs + N * C;  // attention is recomputed
    sum.split += layer.split, sum.whole += layer.whole;
  }
  return {sum.split / double(m.layers), sum.whole / double(m.layers)};
}

// GiB with the digits that matter: 136, 18.6, 0.42.
std::string gib(double bytes) {
  const double g = bytes / kGiB;
  char buf[32];
  std::snprintf(buf, sizeof buf, g >= 100 ? "%.0f" : g >= 1 ? "%.1f" : "%.2g", g);
  return buf;
}

}  // namespace

MemoryEstimate estimate_memory(const core::JobSpec& spec, int world) {
  const core::ModelSpec& m = spec.model;
  Degrees deg;
  int64_t micro_batch = spec.train.micro_batch, micro_batches = 1, in_flight = 1, zero = 0;
  std::string recompute = "none";
  bool sp = false;
  if (world > 1) {
    ParallelConfig pc = resolve_parallel(spec, world);
    deg = pc.deg;
    micro_batch = pc.micro_batch;
    micro_batches = pc.micro_batches;
    zero = pc.zero;
    recompute = pc.recompute;
    sp = pc.sequence_parallel;
    // GPipe runs every forward before the first backward; 1F1B (and interleaved) keep at
    // most one micro-batch per stage in flight on the first stage.
    in_flight = pc.schedule == "gpipe" ? micro_batches : std::min(deg.pp, micro_batches);
  }
  const double tp = double(deg.tp), pp = double(deg.pp), ep = double(deg.ep), dp = double(deg.dp);
  const Counts c = count_parameters(m);
  const double stage_layers = std::ceil(double(m.layers) / pp);
  const double per_layer = c.layer_params / double(m.layers);
  const double per_layer_experts = c.expert_params / double(m.layers);
  // The first stage's share: its layers (experts also split by ep) and the embeddings.
  double params = stage_layers * (per_layer - per_layer_experts + per_layer_experts / ep) / tp +
                  c.embed_params / tp;

  MemoryEstimate e;
  e.parameters = kF32 * params / (zero >= 3 ? dp : 1);
  e.gradients = kF32 * params / (zero >= 2 ? dp : 1);
  e.optimizer = 2 * kF32 * params / (zero >= 1 ? dp : 1);

  const double B = double(micro_batch), N = B * double(m.seq_len);
  const double saved = layer_activations(m, B, recompute).per_rank(tp, sp);
  // One layer's backward, recomputed.
  const double working = layer_activations(m, B, "none").per_rank(tp, sp);
  // ln_f (whole) and the vocabulary-parallel logits and probs (split); the embedding's output.
  const double head = Acts{2 * N * double(m.vocab), N * (double(m.dim) + 2)}.per_rank(tp, sp);
  const double embed = Acts{0, N * double(m.dim)}.per_rank(tp, sp);
  const double first = double(in_flight) * (stage_layers * saved + embed);
  const double last = (pp > 1 ? 1.0 : double(in_flight)) * stage_layers * saved + head;
  e.activations = kF32 * (std::max(first, last) + working);
  return e;
}

MemoryEstimate estimate_stage_memory(const core::ModelSpec& m, const Degrees& deg, int zero,
                                     int64_t micro_batch, const std::string& recompute,
                                     const StageShape& st, bool sequence_parallel) {
  const double tp = double(deg.tp), ep = double(deg.ep), dp = double(deg.dp);
  const double C = double(m.dim), V = double(m.vocab), layers = double(st.layers);
  const Counts c = count_parameters(m);
  const double per_layer = c.layer_params / double(m.layers);
  const double per_layer_experts = c.expert_params / double(m.layers);
  // embed_params split by stage: the token (and GPT's position) table on the first, the final
  // norm and the head (untied; or the tied table's copy when it is not also the first) on the last.
  const double embed = V * C + (m.is_llama() ? 0 : double(m.seq_len) * C);
  const double norm = m.is_llama() ? C : 2 * C;
  const bool tied = !m.is_llama() || m.tie_embeddings;
  const double head = norm + (tied && st.first ? 0 : V * C);
  const double params = (layers * (per_layer - per_layer_experts + per_layer_experts / ep) +
                         (st.first ? embed : 0) + (st.last ? head : 0)) /
                        tp;
  MemoryEstimate e;
  e.parameters = kF32 * params / (zero >= 3 ? dp : 1);
  e.gradients = kF32 * params / (zero >= 2 ? dp : 1);
  e.optimizer = 2 * kF32 * params / (zero >= 1 ? dp : 1);
  const double B = double(micro_batch), N = B * double(m.seq_len);
  const double in_flight = double(st.in_flight);
  const bool sp = sequence_parallel;
  double act = in_flight * layers * layer_activations(m, B, recompute).per_rank(tp, sp) +
               layer_activations(m, B, "none").per_rank(tp, sp);  // one layer's backward
  if (st.first) act += in_flight * Acts{0, N * C}.per_rank(tp, sp);
  if (st.last) act += Acts{2 * N * V, N * (C + 2)}.per_rank(tp, sp);  // ln_f, logits, probs
  e.activations = kF32 * act;
  return e;
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream ss(line.substr(13));
    int64_t kib = -1;
    if (ss >> kib && kib >= 0) return kib * 1024;
  }
  return -1;
}

void check_fits_memory(const core::JobSpec& spec, int world, int ranks_on_node) {
  ranks_on_node = std::max(ranks_on_node, 1);
  double limit = 0;
  std::string have;
  if (spec.memory.limit_gib > 0) {
    limit = spec.memory.limit_gib * kGiB;
    have = "memory.limit_gib allows " + gib(limit) + " GiB per rank";
  } else {
    const int64_t avail = available_memory_bytes();
    if (avail < 0) return;  // no /proc/meminfo: nothing to judge against
    limit = double(avail) / double(ranks_on_node);
    have = "this machine has " + gib(double(avail)) + " GiB available for " +
           std::to_string(ranks_on_node) + (ranks_on_node == 1 ? " rank" : " ranks");
  }
  const MemoryEstimate e = estimate_memory(spec, world);
  if (e.total() <= limit) return;
  throw ConfigError("model", "the job needs " + gib(e.total()) + " GiB per rank (parameters " +
                                 gib(e.parameters) + ", gradients " + gib(e.gradients) +
                                 ", optimizer " + gib(e.optimizer) + ", activations " +
                                 gib(e.activations) + ") but " + have +
                                 "; shrink model.layers/model.dim (or train.micro_batch), shard "
                                 "more (parallel.*), or set memory.limit_gib");
}

}  // namespace weft::planner
