// JobSpec: the validated, typed form of a job's YAML file (ARCHITECTURE.md, "YAML").
// Every other module reads its settings from here, never from YAML directly.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace weft::core {

struct MoeSpec {
  int64_t experts = 0;  // 0: not an MoE model
  int64_t top_k = 2;
  int64_t every = 1;                 // layer i is MoE when i % every == every - 1
  double capacity_factor = 0.0;      // 0: no dropping
  std::string balance = "aux_loss";  // aux_loss | aux_loss_global | loss_free
  double aux_coef = 0.01;
  // loss_free: the routing bias step per optimizer step (DeepSeek-V3's update speed).
  double bias_update_rate = 0.001;
};

struct ModelSpec {
  std::string arch = "gpt";  // gpt | moe-gpt | llama
  int64_t layers = 2, dim = 64, heads = 4, vocab = 256, seq_len = 32;
  int64_t mlp_ratio = 4;  // gpt, moe-gpt: MLP width = mlp_ratio * dim
  MoeSpec moe;
  // arch llama only (shared/reference/README.md); the loader refuses them with another arch.
  int64_t kv_heads = 0;  // key/value heads of grouped-query attention; 0: heads
  int64_t ffn_dim = 0;   // SwiGLU width; 0: Llama's rule (llama_ffn_dim)
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tie_embeddings = false;  // the LM head reads embed_tokens (no lm_head.weight)

  bool is_llama() const { return arch == "llama"; }
  bool is_moe_layer(int64_t i) const {
    return arch == "moe-gpt" && moe.experts > 0 && i % moe.every == moe.every - 1;
  }
  // Key/value heads: kv_heads for Llama when set, else heads (GPT's attention has H of each).
  int64_t kv() const { return is_llama() && kv_heads > 0 ? kv_heads : heads; }
  // The hidden width of the MLP (Llama: of gate and up).
  int64_t mlp_width() const {
    if (!is_llama()) return mlp_ratio * dim;
    return ffn_dim > 0 ? ffn_dim : llama_ffn_dim(dim);
  }
  // Llama's default SwiGLU width: 2/3 of 4*dim, rounded up to a multiple of 16 (as
  // shared/reference/make_reference.py: ((8*dim // 3) + 15) // 16 * 16; 64 -> 176).
  static int64_t llama_ffn_dim(int64_t dim) { return (8 * dim / 3 + 15) / 16 * 16; }
};

struct DataSpec {
  std::string path;                // resolved against the config file's folder
  std::string val_path;            // empty: hold out the tail of `path` (val_fraction)
  std::string order = "shuffled";  // shuffled | sequential
  // Share of `path` held out for validation when val_path is empty and train.eval_every > 0
  // (without evaluation every token trains, so a run matches shared/reference/ exactly).
  double val_fraction = 0.05;
};

struct TrainSpec {
  // micro_batch 0: `auto` in YAML, chosen by the plan search (planner/search.h).
  int64_t steps = 100, global_batch = 8, micro_batch = 8;
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup_steps = 0;
  std::string schedule = "cosine";  // cosine | constant
  double weight_decay = 0.1;
  std::array<double, 2> betas{0.9, 0.95};
  double eps = 1e-8, grad_clip = 1.0;
  uint64_t seed = 1234;
  std::string dtype = "f32";  // f32 | bf16
  int64_t threads = 0;        // 0: OpenMP default
  int64_t eval_every = 0;     // 0: never
  int64_t eval_batches = 4;
  int64_t log_every = 1;
  // A step whose loss or gradient norm is not finite is never applied: `stop` ends the run
  // (exit 1), `skip` drops it and goes on, ending after max_skipped dropped in a row.
  std::string on_nonfinite = "stop";  // stop | skip
  int64_t max_skipped = 5;
  // Run folder: metrics, loss curve, summary. When the YAML file does not set it,
  // load_job_spec uses runs/<config file stem> (relative to the working directory;
  // a file named config.yaml is named by its folder).
  std::string out_dir = "runs/latest";
};

// A parallel degree: a number, or auto (0 here) to be filled in by the planner. dp: auto
// takes what the world leaves; any other key left auto (tp, pp, ep, zero, schedule,
// virtual_stages, layout, recompute, train.micro_batch) is chosen by the plan search
// (planner/search.h), as is every key the file does not set under plan: search.
struct PipelineSpec {
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved | auto
  int64_t micro_batches = 0;      // 0: derived from global_batch / (micro_batch * dp)
  int64_t virtual_stages = 1;     // 0: auto
  std::vector<std::vector<int64_t>> layout;  // per stage, the layer indices; empty: even split
  bool layout_auto = false;                  // `layout: auto`: the search places the layers
};

struct ParallelSpec {
  static constexpr int64_t kAutoZero = -1;  // zero: auto
  int64_t dp = 0, tp = 1, pp = 1, ep = 1;  // 0 = auto
  int64_t zero = 0;                         // 0..3, or kAutoZero
  std::string order = "tp-ep-dp-pp";
  PipelineSpec pipeline;
  std::string recompute = "none";  // none | selective | full | auto
  std::string plan = "manual";     // manual | search
  // Megatron's sequence parallelism: with tp > 1 the norms and residual adds run on 1/tp of
  // the sequence, and the tp all-reduces become reduce-scatter / all-gather pairs (a phase-1
  // choice, planner/policy.cc). Refused with tp 1, where it would do nothing. `auto` (and
  // plan: search without the key): the plan search chooses it per candidate.
  bool sequence_parallel = false;
  bool sequence_parallel_auto = false;
};

struct MemorySpec {
  std::string allocator = "caching";  // caching | planned
  // GiB per rank the job may use; 0 (`auto` in YAML): MemAvailable of /proc/meminfo divided
  // by the ranks on this node. weft train refuses a job whose estimate exceeds it. Also the
  // plan search's cap per rank (planner/search.h; unset: the cost model's device memory).
  double limit_gib = 0;
};

struct CheckpointSpec {
  std::string dir;
  int64_t every = 0, keep = 3;
  bool async = true;
};

struct SnapshotSpec {
  // 0: off; K > 0: a snapshot every K steps; kAuto (`every: auto`): the interval is chosen
  // at run time from what the first snapshot costs (launch/rank_snapshots.h).
  static constexpr int64_t kAuto = -1;
  int64_t every = 0;
  bool enabled() const { return every != 0; }
  std::string redundancy = "none";  // none | replica | ec
  int64_t ec_k = 2, ec_m = 1;
};

// What the job expects of `weft run`'s elasticity. min_nodes/max_nodes, when set, must match
// the agent's --nnodes MIN:MAX (weft train checks; 0 = whatever the agent says). on_change:
// reshard (the default) keeps the survivors of a membership change running and moves their
// state live; restart stops every worker and restarts it from the latest checkpoint.
struct ElasticSpec {
  int64_t min_nodes = 0, max_nodes = 0;
  std::string on_change = "reshard";  // reshard | restart
  // fixed: a world whose size the fixed degrees (tp, pp, ep, a fixed dp) do not fit stops
  // the job naming them; auto: the nearest layout that fits is used instead (planner::
  // fit_layout), and the job says which degrees changed.
  std::string layout = "fixed";  // fixed | auto
  // A survivor's old state during a reshard (on_change: reshard only). free_as_moved (the
  // default): freed as it moves (peak: the larger of the old and the new holding plus the
  // router's budget); a newer epoch that stops the move midway finds the state of the same
  // step in the pieces of the two layouts the ranks hold then, but a rank lost during the
  // move may take the only copy of what it had received (then the latest snapshot or
  // checkpoint). keep_unless_backed: held whole until the new world is entered, which also
  // survives such a loss (peak: old plus new), unless in-memory snapshots of the same step
  // back it (then freed as it moves).
  std::string old_state = "free_as_moved";  // free_as_moved | keep_unless_backed
  // TCP connections per pair of ranks that carry the state between hosts during a reshard
  // (on_change: reshard only): messages of 256 KiB and more are cut into this many stripes
  // sent at once (parallel/transfer_connections.h), as NCCL's several sockets per peer. One
  // stream rarely fills a link between hosts; pairs on one host use shared memory, and a
  // world on one host connects no extra ones. 1..16.
  int64_t transfer_connections = 4;
};

struct JobSpec {
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  ParallelSpec parallel;
  std::string device = "cpu";  // cpu | cuda
  MemorySpec memory;
  CheckpointSpec checkpoint;
  SnapshotSpec snapshot;
  ElasticSpec elastic;
  std::string source_path;  // the YAML file it came from (empty when built in code)
  // What the loader adjusted, one line each (a warm-up longer than the run is clipped to
  // it); the launcher prints them once, on rank 0.
  std::vector<std::string> notes;
};

// Loads and validates a YAML job file. `overrides` are "a.b=value" strings (--set),
// applied before validation. Throws ConfigError naming the key path and the fix for
// unknown keys, a key or section written twice in the file (both lines named), wrong
// types, out-of-range values (every integer has an upper bound, core/config/limits.h) and
// inconsistent settings.
JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from YAML text; relative paths resolve against `base_dir`.
JobSpec parse_job_spec(const std::string& yaml_text, const std::string& base_dir,
                       const std::vector<std::string>& overrides = {});
// Checks every value's range and cross-field consistency (heads divide dim, micro_batch
// divides global_batch, top_k <= experts...); throws ConfigError naming the field.
// Whether data files exist is checked when they are read (core/data/).
void validate_job_spec(const JobSpec& spec);

// The spec as YAML (every key, degrees 0 written as `auto`); parse_job_spec of the result
// gives back an equal spec. Written into the run folder so a run can be repeated.
std::string job_spec_to_yaml(const JobSpec& spec);

// A hash of the model fields that fix parameter names and shapes (arch, layers, dim,
// heads, vocab, seq_len, mlp_ratio, experts, every): a checkpoint or weights file records
// it so that loading one written for another model fails with a clear message.
uint64_t model_config_hash(const ModelSpec& model);

}  // namespace weft::core
