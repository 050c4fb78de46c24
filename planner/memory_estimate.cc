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

// Values one layer saves for backward for one micro-batch of B sequences, averaged over
// the layers (MoE layers replace the MLP's by the routed tokens').
double layer_activations(const core::ModelSpec& m, double B, const std::string& recompute) {
  const double T = double(m.seq_len), C = double(m.dim), F = double(m.mlp_width());
  const double H = double(m.heads), N = B * T;
  if (m.is_llama()) {
    // norm (out, rstd), q, k, v, rotated q and k, attention out, o_proj, residual, norm,
    // gate, up, swiglu, down, residual; probs (B,H,T,T) as GPT's.
    const double kv = double(m.kv()) * (C / H);
    const double attn_part = N * (C + 1) + N * (C + 2 * kv) + N * (C + kv) + 3 * N * C + N * (C + 1);
    const double probs = B * H * T * T, mlp = 3 * N * F + 2 * N * C;
    if (recompute == "full") return N * C;
    return attn_part + probs + mlp - (recompute == "selective" ? probs + N * C : 0);
  }
  // ln_1 (out, mean, rstd), qkv, attention out, proj, res_1, ln_2, res_2.
  const double attn_part = N * (C + 2) + 3 * N * C + N * C + N * C + N * C + N * (C + 2) + N * C;
  const double probs = B * H * T * T;
  const double mlp = N * F * 2 + N * C;  // fc, gelu, proj
  const double k = double(m.moe.top_k), E = double(m.moe.experts);
  const double moe =
      N * C + N * E + N * k * 2 + N * k * (2 * C + F);  // out, probs, route, xe/ye, he
  double sum = 0;
  for (int64_t i = 0; i < m.layers; ++i) {
    double layer = attn_part + probs + (m.is_moe_layer(i) ? moe : mlp);
    if (recompute == "selective") layer -= probs + N * C;  // attention is recomputed
    if (recompute == "full") layer = N * C;                // only the layer's input is kept
    sum += layer;
  }
  return sum / double(m.layers);
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
  if (world > 1) {
    ParallelConfig pc = resolve_parallel(spec, world);
    deg = pc.deg;
    micro_batch = pc.micro_batch;
    micro_batches = pc.micro_batches;
    zero = pc.zero;
    recompute = pc.recompute;
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
  const double saved = layer_activations(m, B, recompute);
  const double working = layer_activations(m, B, "none");  // one layer's backward, recomputed
  const double head = N * (double(m.dim) + 2) + 2 * N * double(m.vocab);  // ln_f, logits, probs
  const double first = double(in_flight) * (stage_layers * saved + N * double(m.dim));
  const double last = (pp > 1 ? 1.0 : double(in_flight)) * stage_layers * saved + head;
  e.activations = kF32 * (std::max(first, last) + working) / tp;
  return e;
}

MemoryEstimate estimate_stage_memory(const core::ModelSpec& m, const Degrees& deg, int zero,
                                     int64_t micro_batch, const std::string& recompute,
                                     const StageShape& st) {
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
  double act = in_flight * layers * layer_activations(m, B, recompute) +
               layer_activations(m, B, "none");  // one layer's backward, recomputed
  if (st.first) act += in_flight * N * C;
  if (st.last) act += N * (C + 2) + 2 * N * V;  // ln_f, logits, probs
  e.activations = kF32 * act / tp;
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
