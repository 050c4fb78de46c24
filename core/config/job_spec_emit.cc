// JobSpec -> YAML (the run folder's copy of the resolved job) and the model hash that
// weights files and checkpoints record.
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <string>

#include "core/config/job_spec.h"
#include "core/rng.h"

namespace weft::core {
namespace {

// Shortest text that reads back as the same double, so a dumped spec re-parses exactly.
std::string fmt(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

std::string degree(int64_t d) { return d == 0 ? "auto" : std::to_string(d); }

template <typename V>
void kv(YAML::Emitter& e, const char* key, const V& value) {
  e << YAML::Key << key << YAML::Value << value;
}
void kv(YAML::Emitter& e, const char* key, double value) {
  e << YAML::Key << key << YAML::Value << fmt(value);
}

void begin(YAML::Emitter& e, const char* key) {
  e << YAML::Key << key << YAML::Value << YAML::BeginMap;
}

}  // namespace

std::string job_spec_to_yaml(const JobSpec& s) {
  YAML::Emitter e;
  if (!s.source_path.empty()) e << YAML::Comment("resolved from " + s.source_path) << YAML::Newline;
  e << YAML::BeginMap;

  const ModelSpec& m = s.model;
  begin(e, "model");
  kv(e, "arch", m.arch);
  kv(e, "layers", m.layers);
  kv(e, "dim", m.dim);
  kv(e, "heads", m.heads);
  kv(e, "vocab", m.vocab);
  kv(e, "seq_len", m.seq_len);
  if (m.is_llama()) {
    // The resolved values, so the emitted file says what ran.
    kv(e, "kv_heads", m.kv());
    kv(e, "ffn_dim", m.mlp_width());
    kv(e, "rope_theta", m.rope_theta);
    kv(e, "norm_eps", m.norm_eps);
    kv(e, "tie_embeddings", m.tie_embeddings);
  } else {
    kv(e, "mlp_ratio", m.mlp_ratio);
  }
  if (m.arch == "moe-gpt") {
    begin(e, "moe");
    kv(e, "experts", m.moe.experts);
    kv(e, "top_k", m.moe.top_k);
    kv(e, "every", m.moe.every);
    kv(e, "capacity_factor", m.moe.capacity_factor);
    kv(e, "balance", m.moe.balance);
    kv(e, "aux_coef", m.moe.aux_coef);
    kv(e, "bias_update_rate", m.moe.bias_update_rate);
    e << YAML::EndMap;
  }
  e << YAML::EndMap;

  begin(e, "data");
  kv(e, "path", s.data.path);
  kv(e, "val_path", s.data.val_path);
  kv(e, "order", s.data.order);
  kv(e, "val_fraction", s.data.val_fraction);
  e << YAML::EndMap;

  const TrainSpec& t = s.train;
  begin(e, "train");
  kv(e, "steps", t.steps);
  kv(e, "global_batch", t.global_batch);
  kv(e, "micro_batch", degree(t.micro_batch));
  kv(e, "lr", t.lr);
  kv(e, "min_lr", t.min_lr);
  kv(e, "warmup_steps", t.warmup_steps);
  kv(e, "schedule", t.schedule);
  kv(e, "weight_decay", t.weight_decay);
  e << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq << fmt(t.betas[0])
    << fmt(t.betas[1]) << YAML::EndSeq;
  kv(e, "eps", t.eps);
  kv(e, "grad_clip", t.grad_clip);
  kv(e, "seed", t.seed);
  kv(e, "dtype", t.dtype);
  kv(e, "threads", t.threads);
  kv(e, "eval_every", t.eval_every);
  kv(e, "eval_batches", t.eval_batches);
  kv(e, "log_every", t.log_every);
  kv(e, "on_nonfinite", t.on_nonfinite);
  kv(e, "max_skipped", t.max_skipped);
  kv(e, "out_dir", t.out_dir);
  e << YAML::EndMap;

  const ParallelSpec& p = s.parallel;
  begin(e, "parallel");
  kv(e, "dp", degree(p.dp));
  kv(e, "tp", degree(p.tp));
  kv(e, "pp", degree(p.pp));
  kv(e, "ep", degree(p.ep));
  if (p.zero == ParallelSpec::kAutoZero) kv(e, "zero", std::string("auto"));
  else kv(e, "zero", p.zero);
  kv(e, "order", p.order);
  begin(e, "pipeline");
  kv(e, "schedule", p.pipeline.schedule);
  kv(e, "micro_batches", degree(p.pipeline.micro_batches));
  kv(e, "virtual_stages", degree(p.pipeline.virtual_stages));
  if (p.pipeline.layout_auto) {
    kv(e, "layout", std::string("auto"));
  } else {
    e << YAML::Key << "layout" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& stage : p.pipeline.layout) {
      e << YAML::Flow << YAML::BeginSeq;
      for (int64_t l : stage) e << l;
      e << YAML::EndSeq;
    }
    e << YAML::EndSeq;
  }
  e << YAML::EndMap;
  kv(e, "recompute", p.recompute);
  kv(e, "plan", p.plan);
  if (p.sequence_parallel_auto) kv(e, "sequence_parallel", std::string("auto"));
  else kv(e, "sequence_parallel", p.sequence_parallel);
  e << YAML::EndMap;

  kv(e, "device", s.device);
  begin(e, "memory");
  kv(e, "allocator", s.memory.allocator);
  if (s.memory.limit_gib > 0) {
    kv(e, "limit_gib", s.memory.limit_gib);
  } else {
    kv(e, "limit_gib", "auto");
  }
  e << YAML::EndMap;

  begin(e, "checkpoint");
  kv(e, "dir", s.checkpoint.dir);
  kv(e, "every", s.checkpoint.every);
  kv(e, "keep", s.checkpoint.keep);
  kv(e, "async", s.checkpoint.async);
  e << YAML::EndMap;

  begin(e, "snapshot");
  if (s.snapshot.every == SnapshotSpec::kAuto)
    kv(e, "every", std::string("auto"));
  else
    kv(e, "every", s.snapshot.every);
  kv(e, "redundancy", s.snapshot.redundancy);
  begin(e, "ec");
  kv(e, "k", s.snapshot.ec_k);
  kv(e, "m", s.snapshot.ec_m);
  e << YAML::EndMap << YAML::EndMap;

  begin(e, "elastic");
  kv(e, "min_nodes", s.elastic.min_nodes);
  kv(e, "max_nodes", s.elastic.max_nodes);
  kv(e, "on_change", s.elastic.on_change);
  kv(e, "layout", s.elastic.layout);
  if (s.elastic.on_change != "restart") {  // refused there
    kv(e, "old_state", s.elastic.old_state);
    kv(e, "transfer_connections", s.elastic.transfer_connections);
  }
  e << YAML::EndMap;

  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

uint64_t model_config_hash(const ModelSpec& m) {
  // Only what fixes parameter names and shapes (and heads, which fixes how qkv is read):
  // changing top_k or aux_coef must not make existing weights unloadable.
  std::string key = "weft-model-v1|" + m.arch + "|" + std::to_string(m.layers) + "|" +
                    std::to_string(m.dim) + "|" + std::to_string(m.heads) + "|" +
                    std::to_string(m.vocab) + "|" + std::to_string(m.seq_len) + "|" +
                    std::to_string(m.mlp_ratio);
  if (m.arch == "moe-gpt")
    key += std::string("|") + std::to_string(m.moe.experts) + "|" + std::to_string(m.moe.every);
  // Llama: kv_heads and ffn_dim fix shapes, tie_embeddings whether lm_head exists; rope_theta
  // and norm_eps do not (like top_k). GPT keys keep their old hash.
  if (m.is_llama())
    key += "|" + std::to_string(m.kv()) + "|" + std::to_string(m.mlp_width()) + "|" +
           (m.tie_embeddings ? "tied" : "untied");
  return stable_hash(key);
}

}  // namespace weft::core
