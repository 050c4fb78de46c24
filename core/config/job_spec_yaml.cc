// YAML -> JobSpec: the key schema, the conversion of each section, --set overrides and
// path resolution. Range and consistency checks live in job_spec_validate.cc.
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "base/error.h"
#include "core/config/job_spec.h"
#include "core/config/job_spec_schema.h"
#include "core/config/yaml_fields.h"

namespace weft::core {
namespace fs = std::filesystem;

const YamlSchema& job_spec_schema() {
  static const YamlSchema schema = {
      {"",
       {"model", "data", "train", "parallel", "device", "memory", "checkpoint", "snapshot",
        "elastic"}},
      {"model",
       {"arch", "layers", "dim", "heads", "vocab", "seq_len", "mlp_ratio", "moe", "kv_heads", "ffn_dim",
        "rope_theta", "norm_eps", "tie_embeddings"}},
      {"model.moe", {"experts", "top_k", "every", "capacity_factor", "balance", "aux_coef", "bias_update_rate"}},
      {"data", {"path", "val_path", "order", "val_fraction"}},
      {"train",
       {"steps", "global_batch", "micro_batch", "lr", "min_lr", "warmup_steps", "schedule",
        "weight_decay", "betas", "eps", "grad_clip", "seed", "dtype", "threads", "eval_every",
        "eval_batches", "log_every", "out_dir", "on_nonfinite", "max_skipped"}},
      {"parallel",
       {"dp", "tp", "pp", "ep", "zero", "order", "pipeline", "recompute", "plan", "sequence_parallel"}},
      {"parallel.pipeline", {"schedule", "micro_batches", "virtual_stages", "layout"}},
      {"memory", {"allocator", "limit_gib"}},
      {"checkpoint", {"dir", "every", "keep", "async"}},
      {"snapshot", {"every", "redundancy", "ec"}},
      {"snapshot.ec", {"k", "m"}},
      {"elastic",
       {"min_nodes", "max_nodes", "on_change", "layout", "old_state", "transfer_connections"}},
  };
  return schema;
}

namespace {

// Keys that only one family reads: given to another arch they would parse and do nothing.
void check_arch_keys(const YamlSection& y, const std::string& arch) {
  static const char* const kLlama[] = {"kv_heads", "ffn_dim", "rope_theta", "norm_eps", "tie_embeddings"};
  static const char* const kGpt[] = {"mlp_ratio", "moe"};
  if (arch == "llama") {
    for (const char* k : kGpt)
      if (y.has(k))
        throw ConfigError(std::string("model.") + k,
                          std::string(k) + " is a GPT key but model.arch is llama; drop it" +
                              (std::string(k) == "mlp_ratio" ? " (llama sets its MLP width with ffn_dim)"
                                                             : " (MoE on the Llama block is not supported)"));
    return;
  }
  for (const char* k : kLlama)
    if (y.has(k))
      throw ConfigError(std::string("model.") + k, std::string(k) + " is a Llama key but model.arch is " +
                                                       arch + "; set arch: llama or drop it");
}

void read_model(const YamlSection& y, ModelSpec& m) {
  y.read("arch", m.arch);
  check_arch_keys(y, m.arch);
  y.read("kv_heads", m.kv_heads);
  y.read("ffn_dim", m.ffn_dim);
  y.read("rope_theta", m.rope_theta);
  y.read("norm_eps", m.norm_eps);
  y.read("tie_embeddings", m.tie_embeddings);
  y.read("layers", m.layers);
  y.read("dim", m.dim);
  y.read("heads", m.heads);
  y.read("vocab", m.vocab);
  y.read("seq_len", m.seq_len);
  y.read("mlp_ratio", m.mlp_ratio);
  YamlSection moe = y.section("moe");
  moe.read("experts", m.moe.experts);
  moe.read("top_k", m.moe.top_k);
  moe.read("every", m.moe.every);
  moe.read("capacity_factor", m.moe.capacity_factor);
  moe.read("balance", m.moe.balance);
  moe.read("aux_coef", m.moe.aux_coef);
  moe.read("bias_update_rate", m.moe.bias_update_rate);
}

void read_train(const YamlSection& y, TrainSpec& t) {
  y.read("steps", t.steps);
  y.read("global_batch", t.global_batch);
  y.read_degree("micro_batch", t.micro_batch);  // auto (0): searched
  y.read("lr", t.lr);
  y.read("min_lr", t.min_lr);
  y.read("warmup_steps", t.warmup_steps);
  y.read("schedule", t.schedule);
  y.read("weight_decay", t.weight_decay);
  y.read("betas", t.betas);
  y.read("eps", t.eps);
  y.read("grad_clip", t.grad_clip);
  y.read("seed", t.seed);
  y.read("dtype", t.dtype);
  y.read("threads", t.threads);
  y.read("eval_every", t.eval_every);
  y.read("eval_batches", t.eval_batches);
  y.read("log_every", t.log_every);
  y.read("on_nonfinite", t.on_nonfinite);
  y.read("max_skipped", t.max_skipped);
  y.read("out_dir", t.out_dir);
}

void read_parallel(const YamlSection& y, ParallelSpec& p) {
  y.read_degree("dp", p.dp);
  y.read_degree("tp", p.tp);
  y.read_degree("pp", p.pp);
  y.read_degree("ep", p.ep);
  if (y.is_auto("zero")) p.zero = ParallelSpec::kAutoZero;
  else y.read("zero", p.zero);
  y.read("order", p.order);
  y.read("recompute", p.recompute);
  y.read("plan", p.plan);
  if (y.is_auto("sequence_parallel")) p.sequence_parallel_auto = true;
  else y.read("sequence_parallel", p.sequence_parallel);
  YamlSection pipe = y.section("pipeline");
  pipe.read("schedule", p.pipeline.schedule);
  pipe.read_degree("micro_batches", p.pipeline.micro_batches);
  pipe.read_degree("virtual_stages", p.pipeline.virtual_stages);
  if (pipe.is_auto("layout")) p.pipeline.layout_auto = true;
  else pipe.read("layout", p.pipeline.layout);
  if (p.plan != "search") return;
  // plan: search searches every key the file leaves out (what it sets stays fixed).
  if (!y.has("tp")) p.tp = 0;
  if (!y.has("pp")) p.pp = 0;
  if (!y.has("ep")) p.ep = 0;
  if (!y.has("zero")) p.zero = ParallelSpec::kAutoZero;
  if (!y.has("recompute")) p.recompute = "auto";
  if (!y.has("sequence_parallel")) p.sequence_parallel_auto = true;
  if (!pipe.has("schedule")) p.pipeline.schedule = "auto";
  if (!pipe.has("virtual_stages")) p.pipeline.virtual_stages = 0;
  if (!pipe.has("layout")) p.pipeline.layout_auto = true;
}

void read_memory(const YamlSection& y, MemorySpec& m) {
  y.read("allocator", m.allocator);
  if (y.is_auto("limit_gib")) {
    m.limit_gib = 0;
    return;
  }
  if (!y.has("limit_gib")) return;
  y.read("limit_gib", m.limit_gib);
  if (m.limit_gib <= 0) {
    std::ostringstream got;
    got << m.limit_gib;
    throw ConfigError("memory.limit_gib",
                      "expected GiB per rank > 0 (e.g. 24), or auto (MemAvailable divided by the "
                      "ranks on this node), got " +
                          got.str());
  }
}

// The first smoke test (`--set train.steps=5` on a config with a longer warm-up) runs: the
// warm-up is clipped to the run, and the spec says so in a note.
void clip_warmup_to_steps(JobSpec& s) {
  TrainSpec& t = s.train;
  if (t.steps < 1 || t.warmup_steps <= t.steps) return;
  s.notes.push_back("train.warmup_steps " + std::to_string(t.warmup_steps) + " > train.steps " +
                    std::to_string(t.steps) + ": warming up over " +
                    (t.steps == 1 ? "the only step" : "all " + std::to_string(t.steps) + " steps"));
  t.warmup_steps = t.steps;
}

// A path the YAML file wrote relative to itself; paths given with --set are relative
// to the working directory like any other command-line path, so they stay as they are.
std::string resolve(const std::string& path, const std::string& base_dir) {
  if (path.empty() || base_dir.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

JobSpec spec_from_tree(YAML::Node& root, const std::string& base_dir,
                       const std::vector<std::string>& overrides) {
  const YamlSchema& schema = job_spec_schema();
  std::set<std::string> overridden = apply_overrides(root, schema, overrides);
  YamlSection top(root, "", schema);
  JobSpec s;
  read_model(top.section("model"), s.model);

  YamlSection data = top.section("data");
  data.read("path", s.data.path);
  data.read("val_path", s.data.val_path);
  data.read("order", s.data.order);
  data.read("val_fraction", s.data.val_fraction);

  YamlSection train = top.section("train");
  read_train(train, s.train);
  read_parallel(top.section("parallel"), s.parallel);
  if (s.parallel.plan == "search" && !train.has("micro_batch")) s.train.micro_batch = 0;
  top.read("device", s.device);
  read_memory(top.section("memory"), s.memory);

  YamlSection ckpt = top.section("checkpoint");
  ckpt.read("dir", s.checkpoint.dir);
  ckpt.read("every", s.checkpoint.every);
  ckpt.read("keep", s.checkpoint.keep);
  ckpt.read("async", s.checkpoint.async);

  YamlSection snap = top.section("snapshot");
  if (snap.is_auto("every")) {
    s.snapshot.every = SnapshotSpec::kAuto;
  } else {
    snap.read("every", s.snapshot.every);
    if (s.snapshot.every < 0)  // kAuto's value is only ever spelled `auto`
      throw ConfigError("snapshot.every",
                        "expected the steps between snapshots (0: none) or auto (the fewest "
                        "steps at which one costs at most 1% of a step), got " +
                            std::to_string(s.snapshot.every));
  }
  snap.read("redundancy", s.snapshot.redundancy);
  snap.section("ec").read("k", s.snapshot.ec_k);
  snap.section("ec").read("m", s.snapshot.ec_m);

  YamlSection el = top.section("elastic");
  el.read("min_nodes", s.elastic.min_nodes);
  el.read("max_nodes", s.elastic.max_nodes);
  el.read("on_change", s.elastic.on_change);
  el.read("layout", s.elastic.layout);
  el.read("old_state", s.elastic.old_state);
  el.read("transfer_connections", s.elastic.transfer_connections);
  // Only a live reshard moves state between ranks (see old_state below).
  if (el.has("transfer_connections") && s.elastic.on_change == "restart")
    throw ConfigError("elastic.transfer_connections",
                      "transfer_connections applies to a live reshard's transfers; under "
                      "elastic.on_change: restart nothing moves between ranks: remove the key "
                      "or set on_change: reshard");
  // Any value acts only on a live reshard: under restart no worker holds old state, and the
  // default (free_as_moved) could not be told from a value given on purpose after parsing.
  if (el.has("old_state") && s.elastic.on_change == "restart")
    throw ConfigError("elastic.old_state",
                      "old_state " + s.elastic.old_state +
                          " applies to a live reshard; under elastic.on_change: restart every "
                          "worker starts anew and holds no old state: remove the key or set "
                          "on_change: reshard");

  auto from_file = [&](const std::string& key) { return !overridden.count(key); };
  if (from_file("data.path")) s.data.path = resolve(s.data.path, base_dir);
  if (from_file("data.val_path")) s.data.val_path = resolve(s.data.val_path, base_dir);
  if (from_file("checkpoint.dir")) s.checkpoint.dir = resolve(s.checkpoint.dir, base_dir);
  if (train.has("out_dir") && from_file("train.out_dir"))
    s.train.out_dir = resolve(s.train.out_dir, base_dir);
  clip_warmup_to_steps(s);
  return s;
}

YAML::Node load_yaml_text(const std::string& text, const std::string& source) {
  try {
    YAML::Node root = YAML::Load(text);
    check_unique_keys(root, source);
    return root;
  } catch (const YAML::Exception& e) {
    std::ostringstream os;
    os << (source.empty() ? "YAML" : source) << ":" << e.mark.line + 1 << ":" << e.mark.column + 1
       << ": not valid YAML: " << e.msg;
    throw ConfigError("--config", os.str());
  }
}

}  // namespace

JobSpec parse_job_spec(const std::string& yaml_text, const std::string& base_dir,
                       const std::vector<std::string>& overrides) {
  YAML::Node root = load_yaml_text(yaml_text, "");
  JobSpec s = spec_from_tree(root, base_dir, overrides);
  validate_job_spec(s);
  return s;
}

JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in || fs::is_directory(path))
    throw ConfigError("--config", "cannot read config file '" + path +
                                      "': no such file (give the path of a .yaml job file)");
  std::stringstream text;
  text << in.rdbuf();
  fs::path abs = fs::absolute(path);
  YAML::Node root = load_yaml_text(text.str(), path);
  JobSpec s = spec_from_tree(root, abs.parent_path().string(), overrides);
  // Name the run after its config unless the file or --set chose a folder.
  const YAML::Node& r = root;
  bool out_dir_given = r.IsMap() && r["train"].IsDefined() && r["train"].IsMap() &&
                       r["train"]["out_dir"].IsDefined();
  // A file named config.yaml is named by its folder (reference/gpt-tiny/config.yaml).
  std::string run_name = abs.stem() == "config" && abs.has_parent_path()
                             ? abs.parent_path().filename().string()
                             : abs.stem().string();
  if (!out_dir_given) s.train.out_dir = (fs::path("runs") / run_name).string();
  s.source_path = abs.lexically_normal().string();
  validate_job_spec(s);
  return s;
}

}  // namespace weft::core
