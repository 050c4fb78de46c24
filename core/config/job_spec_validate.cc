// validate_job_spec: every value's range and the consistency between fields, each
// failure a ConfigError that names the key path and says how to fix it.
#include <algorithm>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>

#include "base/error.h"
#include "core/config/job_spec.h"
#include "core/config/limits.h"

namespace weft::core {
namespace {

template <typename T>
std::string num(T v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void one_of(const std::string& field, const std::string& value,
            std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    if (!list.empty()) list += "|";
    list += a;
  }
  throw ConfigError(field, "expected one of " + list + ", got '" + value + "'");
}

void at_least(const std::string& field, int64_t v, int64_t lo) {
  if (v < lo) throw ConfigError(field, "expected an integer >= " + num(lo) + ", got " + num(v));
}

// Every integer field has an upper bound (core/config/limits.h): values beyond it are typos
// or tests of the machine, and would overflow the size arithmetic downstream.
void between(const std::string& field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    throw ConfigError(field,
                      "expected an integer in [" + num(lo) + ", " + num(hi) + "], got " + num(v));
}

// Products of sizes must stay exact in int64 (and double): each factor is a named field;
// the product is refused above limits::kMaxProduct, naming every factor.
struct Factor {
  const char* field;
  int64_t value;
};
void bounded_product(const std::string& field, std::initializer_list<Factor> factors,
                     const std::string& what) {
  int64_t p = 1;
  bool over = false;
  std::string names;
  for (const Factor& f : factors) {
    names += std::string(names.empty() ? "" : " x ") + f.field + " (" + num(f.value) + ")";
    if (!over && (__builtin_mul_overflow(p, f.value, &p) || p > limits::kMaxProduct)) over = true;
  }
  if (over)
    throw ConfigError(field, names + " exceeds 2^53 " + what +
                                 ": no machine holds that; make one of them smaller");
}

void in_range(const std::string& field, double v, double lo, bool lo_open, double hi,
              bool hi_open) {
  bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok)
    throw ConfigError(field, "expected a number in " + std::string(lo_open ? "(" : "[") + num(lo) +
                                 ", " + num(hi) + (hi_open ? ")" : "]") + ", got " + num(v));
}
constexpr double kInf = 1e300;

// The Llama block: grouped-query attention, rotary positions, a SwiGLU of width ffn_dim.
void validate_llama(const ModelSpec& m) {
  if (m.moe.experts > 0)
    throw ConfigError("model.moe.experts", "MoE on the Llama block is not supported (model.arch is llama); "
                                           "drop model.moe or use arch: moe-gpt");
  between("model.kv_heads", m.kv_heads, 0, limits::kMaxHeads);
  if (m.kv_heads > 0 && m.heads % m.kv_heads != 0)
    throw ConfigError("model.kv_heads", "model.kv_heads (" + num(m.kv_heads) + ") must divide model.heads (" +
                                            num(m.heads) + "): each KV head serves heads/kv_heads query heads");
  if ((m.dim / m.heads) % 2 != 0)
    throw ConfigError("model.heads", "the head size dim/heads (" + num(m.dim) + "/" + num(m.heads) + " = " +
                                         num(m.dim / m.heads) +
                                         ") must be even for rotary positions; change model.dim or model.heads");
  between("model.ffn_dim", m.ffn_dim, 0, limits::kMaxDim * limits::kMaxMlpRatio);
  in_range("model.rope_theta", m.rope_theta, 0, true, kInf, false);
  in_range("model.norm_eps", m.norm_eps, 0, true, 1, false);
}

void validate_model(const ModelSpec& m) {
  one_of("model.arch", m.arch, {"gpt", "moe-gpt", "llama"});
  between("model.layers", m.layers, 1, limits::kMaxLayers);
  between("model.dim", m.dim, 1, limits::kMaxDim);
  between("model.heads", m.heads, 1, limits::kMaxHeads);
  between("model.vocab", m.vocab, 2, limits::kMaxVocab);
  between("model.seq_len", m.seq_len, 1, limits::kMaxSeqLen);
  between("model.mlp_ratio", m.mlp_ratio, 1, limits::kMaxMlpRatio);
  if (m.dim % m.heads != 0)
    throw ConfigError("model.heads", "model.heads (" + num(m.heads) + ") must divide model.dim (" +
                                         num(m.dim) + ")");
  const MoeSpec& e = m.moe;
  if (m.is_llama()) return validate_llama(m);
  if (m.arch == "gpt") {
    if (e.experts > 0)
      throw ConfigError("model.arch",
                        "model.moe.experts is " + num(e.experts) +
                            " but model.arch is gpt; use arch: moe-gpt or drop model.moe");
    return;
  }
  if (e.experts < 1)
    throw ConfigError("model.moe.experts",
                      "arch moe-gpt needs model.moe.experts >= 1, got " + num(e.experts));
  between("model.moe.experts", e.experts, 1, limits::kMaxExperts);
  at_least("model.moe.top_k", e.top_k, 1);
  if (e.top_k > e.experts)
    throw ConfigError("model.moe.top_k",
                      "top_k (" + num(e.top_k) + ") must be <= experts (" + num(e.experts) + ")");
  between("model.moe.every", e.every, 1, limits::kMaxLayers);
  if (e.every > m.layers)
    throw ConfigError("model.moe.every", "every " + num(e.every) + " > layers " + num(m.layers) +
                                             ": no layer would be an MoE layer");
  in_range("model.moe.capacity_factor", e.capacity_factor, 0, false, kInf, false);
  one_of("model.moe.balance", e.balance, {"aux_loss", "aux_loss_global", "loss_free"});
  in_range("model.moe.aux_coef", e.aux_coef, 0, false, kInf, false);
  in_range("model.moe.bias_update_rate", e.bias_update_rate, 0, false, kInf, false);
}

void validate_train(const TrainSpec& t) {
  between("train.steps", t.steps, 1, limits::kMaxSteps);
  between("train.global_batch", t.global_batch, 1, limits::kMaxBatch);
  between("train.micro_batch", t.micro_batch, 0, limits::kMaxBatch);  // 0: auto (searched)
  if (t.micro_batch > 0 && t.global_batch % t.micro_batch != 0)
    throw ConfigError("train.micro_batch", "micro_batch (" + num(t.micro_batch) +
                                               ") must divide global_batch (" +
                                               num(t.global_batch) + ")");
  in_range("train.lr", t.lr, 0, true, kInf, false);
  in_range("train.min_lr", t.min_lr, 0, false, kInf, false);
  if (t.min_lr > t.lr)
    throw ConfigError("train.min_lr",
                      "min_lr (" + num(t.min_lr) + ") must not exceed lr (" + num(t.lr) + ")");
  // A warm-up longer than the run is clipped to it by the loader (clip_warmup_to_steps).
  between("train.warmup_steps", t.warmup_steps, 0, t.steps);
  one_of("train.schedule", t.schedule, {"cosine", "constant"});
  in_range("train.weight_decay", t.weight_decay, 0, false, kInf, false);
  in_range("train.betas", t.betas[0], 0, false, 1, true);
  in_range("train.betas", t.betas[1], 0, false, 1, true);
  in_range("train.eps", t.eps, 0, true, kInf, false);
  in_range("train.grad_clip", t.grad_clip, 0, false, kInf, false);
  one_of("train.dtype", t.dtype, {"f32", "bf16"});
  between("train.threads", t.threads, 0, limits::kMaxThreads);
  between("train.eval_every", t.eval_every, 0, limits::kMaxSteps);
  between("train.eval_batches", t.eval_batches, 1, limits::kMaxEvalBatches);
  between("train.log_every", t.log_every, 1, limits::kMaxSteps);
  one_of("train.on_nonfinite", t.on_nonfinite, {"stop", "skip"});
  between("train.max_skipped", t.max_skipped, 1, limits::kMaxSteps);
  if (t.out_dir.empty()) throw ConfigError("train.out_dir", "must name a folder for the run");
}

// The products of sizes that the model builders, the planner, the memory estimate and the
// data sampler compute in int64; each stays exact (<= 2^53) once the fields are in range.
void validate_size_products(const JobSpec& s) {
  const ModelSpec& m = s.model;
  // micro_batch: auto may become any divisor of the global batch: bound the largest.
  TrainSpec t = s.train;
  if (t.micro_batch == 0) t.micro_batch = t.global_batch;
  const int64_t experts = m.arch == "moe-gpt" ? std::max<int64_t>(m.moe.experts, 1) : 1;
  if (m.is_llama()) {
    // The MLP width is ffn_dim itself (mlp_width: Llama's rule when 0).
    bounded_product("model",
                    {{"model.layers", m.layers}, {"model.dim", m.dim}, {"model.ffn_dim", m.mlp_width()}},
                    "parameters");
    bounded_product("train.micro_batch",
                    {{"train.micro_batch", t.micro_batch},
                     {"model.seq_len", m.seq_len},
                     {"model.ffn_dim", m.mlp_width()}},
                    "activation values");
  } else {
    bounded_product("model",
                    {{"model.layers", m.layers},
                     {"model.dim", m.dim},
                     {"model.dim", m.dim},
                     {"model.mlp_ratio", m.mlp_ratio},
                     {"model.moe.experts", experts}},
                    "parameters");
    bounded_product("train.micro_batch",
                    {{"train.micro_batch", t.micro_batch},
                     {"model.seq_len", m.seq_len},
                     {"model.dim", m.dim},
                     {"model.mlp_ratio", m.mlp_ratio}},
                    "activation values");
  }
  bounded_product("train.micro_batch",
                  {{"train.micro_batch", t.micro_batch},
                   {"model.seq_len", m.seq_len},
                   {"model.vocab", m.vocab}},
                  "logits");
  bounded_product("train.micro_batch",
                  {{"train.micro_batch", t.micro_batch},
                   {"model.heads", m.heads},
                   {"model.seq_len", m.seq_len},
                   {"model.seq_len", m.seq_len}},
                  "attention scores");
  bounded_product("train.steps",
                  {{"train.steps", t.steps},
                   {"train.global_batch", t.global_batch},
                   {"model.seq_len", m.seq_len}},
                  "token positions");
  bounded_product("train.eval_batches",
                  {{"train.eval_batches", t.eval_batches},
                   {"train.global_batch", t.global_batch},
                   {"model.seq_len", m.seq_len}},
                  "token positions");
}

void validate_parallel(const ParallelSpec& p, const JobSpec& s) {
  between("parallel.dp", p.dp, 0, limits::kMaxDegree);
  between("parallel.tp", p.tp, 0, limits::kMaxDegree);
  between("parallel.pp", p.pp, 0, limits::kMaxDegree);
  between("parallel.ep", p.ep, 0, limits::kMaxDegree);
  if ((p.zero < 0 || p.zero > 3) && p.zero != ParallelSpec::kAutoZero)
    throw ConfigError("parallel.zero", "expected 0, 1, 2, 3 or auto, got " + num(p.zero));
  // order: each of tp, ep, dp, pp exactly once, '-' separated, first varies fastest.
  std::multiset<std::string> axes;
  std::stringstream ss(p.order);
  for (std::string a; std::getline(ss, a, '-');) axes.insert(a);
  if (axes != std::multiset<std::string>{"dp", "ep", "pp", "tp"})
    throw ConfigError("parallel.order",
                      "expected tp, ep, dp and pp each once, joined by '-' "
                      "(e.g. tp-ep-dp-pp), got '" +
                          p.order + "'");
  one_of("parallel.recompute", p.recompute, {"none", "selective", "full", "auto"});
  one_of("parallel.plan", p.plan, {"manual", "search"});

  const ModelSpec& m = s.model;
  if (p.tp > 1 && m.heads % p.tp != 0)
    throw ConfigError("parallel.tp",
                      "tp (" + num(p.tp) + ") must divide model.heads (" + num(m.heads) + ")");
  if (p.tp > 1 && m.kv() % p.tp != 0)
    throw ConfigError("parallel.tp", "tp (" + num(p.tp) + ") must divide model.kv_heads (" + num(m.kv()) +
                                         "): tensor parallelism splits the KV heads");
  if (p.ep > 1 && m.arch != "moe-gpt")
    throw ConfigError("parallel.ep", "expert parallelism (ep " + num(p.ep) +
                                         ") needs model.arch: moe-gpt; set ep: 1");
  if (p.ep > 1 && m.moe.experts % p.ep != 0)
    throw ConfigError("parallel.ep", "ep (" + num(p.ep) + ") must divide model.moe.experts (" +
                                         num(m.moe.experts) + ")");
  // tp auto (0) is checked once the search or resolve_parallel has fixed it.
  if (p.sequence_parallel && p.tp == 1)
    throw ConfigError("parallel.sequence_parallel",
                      "sequence parallelism splits the tensor-parallel regions' norms and residual "
                      "adds over the tp ranks, so with tp 1 it does nothing; set parallel.tp to 2 "
                      "or more, or remove parallel.sequence_parallel");
  if (p.sequence_parallel && p.tp > 1 && m.seq_len % p.tp != 0)
    throw ConfigError("parallel.sequence_parallel",
                      "sequence parallelism splits model.seq_len (" + num(m.seq_len) +
                          ") over tp (" + num(p.tp) + "), which must divide it; change "
                          "model.seq_len or parallel.tp, or remove parallel.sequence_parallel");
  if (p.pp > m.layers)
    throw ConfigError("parallel.pp", "pp (" + num(p.pp) + ") exceeds model.layers (" +
                                         num(m.layers) + "): a stage would have no layer");
  const TrainSpec& t = s.train;
  if (p.dp > 0 && t.micro_batch > 0 && t.global_batch % (t.micro_batch * p.dp) != 0)
    throw ConfigError("parallel.dp", "global_batch (" + num(t.global_batch) +
                                         ") must be a multiple of micro_batch x dp (" +
                                         num(t.micro_batch) + " x " + num(p.dp) + ")");

  const PipelineSpec& pl = p.pipeline;
  one_of("parallel.pipeline.schedule", pl.schedule, {"gpipe", "1f1b", "interleaved", "auto"});
  between("parallel.pipeline.micro_batches", pl.micro_batches, 0, limits::kMaxDegree);
  between("parallel.pipeline.virtual_stages", pl.virtual_stages, 0, limits::kMaxDegree);  // 0: auto
  if (pl.micro_batches > 0 && t.micro_batch == 0)
    throw ConfigError("parallel.pipeline.micro_batches",
                      "fixes the micro-batch count while train.micro_batch is auto; set one of "
                      "them (or leave micro_batches out)");
  if (pl.layout_auto && !pl.layout.empty())
    throw ConfigError("parallel.pipeline.layout", "is both auto and a list of stages");
  if (pl.virtual_stages > 1 && pl.schedule != "interleaved" && pl.schedule != "auto")
    throw ConfigError("parallel.pipeline.virtual_stages",
                      "virtual_stages > 1 needs parallel.pipeline.schedule: interleaved");
  if (!pl.layout.empty()) {
    // Stages in order, together holding every layer once, in ascending order.
    int64_t next = 0;
    for (const auto& stage : pl.layout) {
      if (stage.empty()) throw ConfigError("parallel.pipeline.layout", "a stage has no layer");
      for (int64_t layer : stage) {
        if (layer != next)
          throw ConfigError("parallel.pipeline.layout",
                            "expected the layers 0.." + num(m.layers - 1) +
                                " in order, each once; found " + num(layer) + " where " +
                                num(next) + " belongs");
        ++next;
      }
    }
    if (next != m.layers)
      throw ConfigError("parallel.pipeline.layout",
                        "covers " + num(next) + " layers, model has " + num(m.layers));
    int64_t stages = int64_t(pl.layout.size());
    if (p.pp > 0 && stages != p.pp * pl.virtual_stages)
      throw ConfigError("parallel.pipeline.layout", "has " + num(stages) +
                                                        " stages, expected pp x virtual_stages = " +
                                                        num(p.pp * pl.virtual_stages));
  }
}

}  // namespace

void validate_job_spec(const JobSpec& s) {
  validate_model(s.model);
  if (s.data.path.empty())
    throw ConfigError("data.path",
                      "required: a token file (.bin), a text file or a folder of "
                      "text files");
  one_of("data.order", s.data.order, {"shuffled", "sequential"});
  in_range("data.val_fraction", s.data.val_fraction, 0, false, 1, true);
  validate_train(s.train);
  validate_size_products(s);
  if (s.train.eval_every > 0 && s.data.val_path.empty() && s.data.val_fraction <= 0)
    throw ConfigError("train.eval_every",
                      "evaluation needs validation data: set data.val_path "
                      "or data.val_fraction > 0 (or eval_every: 0)");
  validate_parallel(s.parallel, s);
  one_of("device", s.device, {"cpu", "cuda"});
  one_of("memory.allocator", s.memory.allocator, {"caching", "planned"});
  in_range("memory.limit_gib", s.memory.limit_gib, 0, false, kInf, false);  // 0: auto
  between("checkpoint.every", s.checkpoint.every, 0, limits::kMaxSteps);
  between("checkpoint.keep", s.checkpoint.keep, 1, limits::kMaxKeep);
  if (s.checkpoint.every > 0 && s.checkpoint.dir.empty())
    throw ConfigError("checkpoint.dir", "checkpoint.every is " + num(s.checkpoint.every) +
                                            ": name a folder for the checkpoints");
  if (s.snapshot.every != SnapshotSpec::kAuto)
    between("snapshot.every", s.snapshot.every, 0, limits::kMaxSteps);  // or auto
  one_of("snapshot.redundancy", s.snapshot.redundancy, {"none", "replica", "ec"});
  between("snapshot.ec.k", s.snapshot.ec_k, 1, limits::kMaxEcBlocks - 1);
  between("snapshot.ec.m", s.snapshot.ec_m, 1, limits::kMaxEcBlocks - s.snapshot.ec_k);
  between("elastic.min_nodes", s.elastic.min_nodes, 0, limits::kMaxNodes);  // 0: the agent's
  between("elastic.max_nodes", s.elastic.max_nodes, 0, limits::kMaxNodes);
  if (s.elastic.max_nodes > 0 && s.elastic.max_nodes < s.elastic.min_nodes)
    throw ConfigError("elastic.max_nodes", "max_nodes (" + num(s.elastic.max_nodes) +
                                               ") is below min_nodes (" + num(s.elastic.min_nodes) +
                                               ")");
  one_of("elastic.on_change", s.elastic.on_change, {"reshard", "restart"});
  one_of("elastic.layout", s.elastic.layout, {"fixed", "auto"});
  one_of("elastic.old_state", s.elastic.old_state, {"keep_unless_backed", "free_as_moved"});
  between("elastic.transfer_connections", s.elastic.transfer_connections, 1,
          limits::kMaxTransferConnections);
  if (s.elastic.on_change == "restart" && s.elastic.old_state != "free_as_moved")
    throw ConfigError("elastic.old_state",
                      "old_state " + s.elastic.old_state +
                          " applies to a live reshard; under elastic.on_change: restart every "
                          "worker starts anew and holds no old state: remove the key or set "
                          "on_change: reshard");
}

}  // namespace weft::core
