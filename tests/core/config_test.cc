// The job spec parser: one test per class of bad input (each checks ConfigError::field()),
// --set overrides, path resolution, the YAML dump round trip, and every shipped config.
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>

#include "base/error.h"
#include "core/config/job_spec.h"
#include "core/config/job_spec_schema.h"

namespace weft::core {
namespace {
namespace fs = std::filesystem;

const char* kMinimal = "data: {path: tokens.bin}\n";

// Runs `fn`, expects a ConfigError, returns it for field and message checks.
ConfigError expect_config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ConfigError";
  return ConfigError("", "");
}

ConfigError parse_error(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  return expect_config_error([&] { parse_job_spec(yaml, "/base", sets); });
}

std::string msg(const ConfigError& e) { return e.what(); }

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("weft_config_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return (path_ / name).string();
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(JobSpec, MinimalFileGetsDefaultsAndResolvedPath) {
  JobSpec s = parse_job_spec(kMinimal, "/base");
  EXPECT_EQ(s.data.path, "/base/tokens.bin");
  EXPECT_EQ(s.model.arch, "gpt");
  EXPECT_EQ(s.train.global_batch, 8);
  EXPECT_EQ(s.parallel.dp, 0);  // auto
  EXPECT_EQ(s.data.order, "shuffled");
  EXPECT_EQ(parse_job_spec("data: {path: /abs/t.bin}", "/base").data.path, "/abs/t.bin");
  EXPECT_EQ(parse_job_spec("data: {path: ../d/t.bin}", "/base/cfg").data.path, "/base/d/t.bin");
}

// Online resize is the default: a job without an elastic: section reshards live on a
// membership change, says so in its dump, and restart is still there when asked for.
TEST(JobSpec, ElasticOnChangeDefaultsToReshard) {
  JobSpec s = parse_job_spec(kMinimal, "/base");
  EXPECT_EQ(s.elastic.on_change, "reshard");
  EXPECT_NE(job_spec_to_yaml(s).find("on_change: reshard"), std::string::npos)
      << job_spec_to_yaml(s);
  EXPECT_EQ(parse_job_spec(job_spec_to_yaml(s), "/").elastic.on_change, "reshard");
  EXPECT_EQ(parse_job_spec(std::string(kMinimal) + "elastic: {min_nodes: 2}", "/base")
                .elastic.on_change,
            "reshard");
  JobSpec r = parse_job_spec(std::string(kMinimal) + "elastic: {on_change: restart}", "/base");
  EXPECT_EQ(r.elastic.on_change, "restart");
  EXPECT_EQ(parse_job_spec(job_spec_to_yaml(r), "/").elastic.on_change, "restart");
  EXPECT_EQ(parse_job_spec(kMinimal, "/", {"elastic.on_change=restart"}).elastic.on_change,
            "restart");
}

// elastic.old_state: free_as_moved by default, keep_unless_backed when asked, a bad value
// refused naming the key and its values, and refused under on_change: restart, where no
// worker holds old state.
TEST(JobSpec, ElasticOldStateDefaultsToFreeAsMovedAndIsRefusedWhereItCannotAct) {
  JobSpec s = parse_job_spec(kMinimal, "/base");
  EXPECT_EQ(s.elastic.old_state, "free_as_moved");
  JobSpec k =
      parse_job_spec(std::string(kMinimal) + "elastic: {old_state: keep_unless_backed}", "/");
  EXPECT_EQ(k.elastic.old_state, "keep_unless_backed");
  EXPECT_EQ(parse_job_spec(job_spec_to_yaml(k), "/").elastic.old_state, "keep_unless_backed");
  try {
    parse_job_spec(kMinimal, "/", {"elastic.old_state=free"});
    ADD_FAILURE() << "a bad elastic.old_state was taken";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "elastic.old_state");
    EXPECT_NE(std::string(e.what()).find("free_as_moved"), std::string::npos) << e.what();
  }
  try {
    parse_job_spec(kMinimal, "/",
                   {"elastic.old_state=keep_unless_backed", "elastic.on_change=restart"});
    ADD_FAILURE() << "elastic.old_state under on_change: restart was taken";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "elastic.old_state");
    EXPECT_NE(std::string(e.what()).find("set on_change: reshard"), std::string::npos) << e.what();
  }
  // The default's value, given on purpose, acts no more under restart: refused too.
  try {
    parse_job_spec(kMinimal, "/", {"elastic.old_state=free_as_moved", "elastic.on_change=restart"});
    ADD_FAILURE() << "elastic.old_state: free_as_moved under on_change: restart was taken";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "elastic.old_state");
  }
  // A restart job's YAML leaves the key out, so it reads back.
  JobSpec r = parse_job_spec(kMinimal, "/", {"elastic.on_change=restart"});
  EXPECT_EQ(parse_job_spec(job_spec_to_yaml(r), "/").elastic.on_change, "restart");
}

// elastic.transfer_connections: 4 by default, read back from the YAML, refused outside
// 1..16 naming the key and the range, and refused under on_change: restart (nothing moves
// between ranks there).
TEST(JobSpec, ElasticTransferConnectionsIsValidatedAndRefusedWhereItCannotAct) {
  EXPECT_EQ(parse_job_spec(kMinimal, "/").elastic.transfer_connections, 4);
  JobSpec k = parse_job_spec(kMinimal, "/", {"elastic.transfer_connections=8"});
  EXPECT_EQ(k.elastic.transfer_connections, 8);
  EXPECT_EQ(parse_job_spec(job_spec_to_yaml(k), "/").elastic.transfer_connections, 8);
  for (const char* bad : {"elastic.transfer_connections=0", "elastic.transfer_connections=17"}) {
    try {
      parse_job_spec(kMinimal, "/", {bad});
      ADD_FAILURE() << bad << " was taken";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "elastic.transfer_connections");
      EXPECT_NE(std::string(e.what()).find("[1, 16]"), std::string::npos) << e.what();
    }
  }
  try {
    parse_job_spec(kMinimal, "/", {"elastic.transfer_connections=2", "elastic.on_change=restart"});
    ADD_FAILURE() << "elastic.transfer_connections under on_change: restart was taken";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "elastic.transfer_connections");
    EXPECT_NE(std::string(e.what()).find("set on_change: reshard"), std::string::npos) << e.what();
  }
}

TEST(JobSpec, ReadsEveryKindOfValue) {
  JobSpec s = parse_job_spec(R"(
model: {arch: moe-gpt, layers: 4, dim: 128, heads: 8, moe: {experts: 8, top_k: 2, every: 2,
        capacity_factor: 1.25, balance: loss_free}}
data: {path: t.bin, val_path: v.bin, order: sequential}
train: {steps: 1e3, lr: 1e-3, betas: [0.8, 0.99], seed: 42, dtype: bf16, eval_every: 10}
parallel: {dp: auto, tp: 2, pp: 2, ep: 4, zero: 2, pipeline: {schedule: interleaved,
           virtual_stages: 2, layout: [[0], [1], [2], [3]]}}
checkpoint: {dir: ckpt, every: 100, async: no}
snapshot: {every: 10, redundancy: ec, ec: {k: 4, m: 2}}
elastic: {min_nodes: 1, max_nodes: 4}
device: cuda
)",
                             "/b");
  EXPECT_EQ(s.model.moe.experts, 8);
  EXPECT_DOUBLE_EQ(s.model.moe.capacity_factor, 1.25);
  EXPECT_EQ(s.model.moe.balance, "loss_free");  // accepted here; the trainer decides support
  EXPECT_TRUE(s.model.is_moe_layer(1));
  EXPECT_FALSE(s.model.is_moe_layer(0));
  EXPECT_EQ(s.train.steps, 1000);
  EXPECT_DOUBLE_EQ(s.train.betas[1], 0.99);
  EXPECT_EQ(s.train.seed, 42u);
  EXPECT_EQ(s.data.val_path, "/b/v.bin");
  EXPECT_EQ(s.parallel.dp, 0);
  EXPECT_EQ(s.parallel.tp, 2);
  EXPECT_EQ(s.parallel.pipeline.layout.size(), 4u);
  EXPECT_EQ(s.checkpoint.dir, "/b/ckpt");
  EXPECT_FALSE(s.checkpoint.async);
  EXPECT_EQ(s.snapshot.ec_m, 2);
  EXPECT_EQ(s.device, "cuda");
}

TEST(JobSpecBadInput, UnknownKeyNamesPathAllowedKeysAndSuggestion) {
  ConfigError e = parse_error("data: {path: t.bin}\ntrain: {lrr: 0.1}\n");
  EXPECT_EQ(e.field(), "train.lrr");
  EXPECT_NE(msg(e).find("did you mean 'train.lr'?"), std::string::npos) << msg(e);
  EXPECT_NE(msg(e).find("allowed keys: steps, global_batch"), std::string::npos) << msg(e);

  e = parse_error("modle: {dim: 64}\ndata: {path: t.bin}\n");
  EXPECT_EQ(e.field(), "modle");
  EXPECT_NE(msg(e).find("did you mean 'model'?"), std::string::npos) << msg(e);

  e = parse_error("data: {path: t.bin}\nmodel: {moe: {expert: 4}}\n");
  EXPECT_EQ(e.field(), "model.moe.expert");
  EXPECT_NE(msg(e).find("'model.moe.experts'"), std::string::npos) << msg(e);

  // Far from every key: no suggestion, but the list is still there.
  e = parse_error("data: {path: t.bin, zzzzzzzz: 1}\n");
  EXPECT_EQ(e.field(), "data.zzzzzzzz");
  EXPECT_EQ(msg(e).find("did you mean"), std::string::npos) << msg(e);
  EXPECT_NE(msg(e).find("val_fraction"), std::string::npos) << msg(e);
}

TEST(JobSpecBadInput, WrongTypeSaysWhatWasExpected) {
  ConfigError e = parse_error("data: {path: t.bin}\ntrain: {lr: abc}\n");
  EXPECT_EQ(e.field(), "train.lr");
  EXPECT_NE(msg(e).find("expected a number, got 'abc'"), std::string::npos) << msg(e);

  e = parse_error("data: {path: t.bin}\ntrain: {steps: 2.5}\n");
  EXPECT_EQ(e.field(), "train.steps");
  EXPECT_NE(msg(e).find("expected an integer"), std::string::npos);

  EXPECT_EQ(parse_error("data: {path: t.bin}\ntrain: {betas: [0.9]}\n").field(), "train.betas");
  EXPECT_EQ(parse_error("data: {path: t.bin}\ntrain: {betas: 0.9}\n").field(), "train.betas");
  EXPECT_EQ(parse_error("data: {path: t.bin}\ncheckpoint: {async: maybe}\n").field(),
            "checkpoint.async");
  EXPECT_EQ(parse_error("data: {path: t.bin}\nmodel: 3\n").field(), "model");
  EXPECT_EQ(parse_error("data: {path: [a, b]}\n").field(), "data.path");
  EXPECT_EQ(parse_error("data: {path: t.bin}\ntrain: {lr: }\n").field(), "train.lr");
  EXPECT_EQ(parse_error("data: {path: t.bin}\nparallel: {tp: two}\n").field(), "parallel.tp");
  EXPECT_EQ(parse_error("data: {path: t.bin}\nparallel: {dp: 0}\n").field(), "parallel.dp");
  EXPECT_EQ(parse_error("data: {path: t.bin}\ntrain: {seed: -1}\n").field(), "train.seed");
}

TEST(JobSpecBadInput, OutOfRangeValues) {
  struct Case {
    const char* yaml;
    const char* field;
  };
  const Case cases[] = {
      {"train: {lr: 0}", "train.lr"},
      {"train: {lr: -0.1}", "train.lr"},
      {"train: {betas: [0.9, 1.0]}", "train.betas"},
      {"train: {betas: [-0.1, 0.9]}", "train.betas"},
      {"train: {dtype: f16}", "train.dtype"},
      {"train: {schedule: linear}", "train.schedule"},
      {"train: {eps: 0}", "train.eps"},
      {"train: {steps: 0}", "train.steps"},
      {"train: {grad_clip: -1}", "train.grad_clip"},
      {"model: {arch: rnn}", "model.arch"},
      {"model: {layers: 0}", "model.layers"},
      {"model: {arch: moe-gpt, moe: {experts: 4, capacity_factor: -1}}",
       "model.moe.capacity_factor"},
      {"model: {arch: moe-gpt, moe: {experts: 4, balance: magic}}", "model.moe.balance"},
      {"model: {arch: moe-gpt}", "model.moe.experts"},
      {"data: {order: random}", "data.order"},
      {"data: {val_fraction: 1.0}", "data.val_fraction"},
      {"parallel: {zero: 4}", "parallel.zero"},
      {"parallel: {order: tp-dp-pp}", "parallel.order"},
      {"parallel: {recompute: some}", "parallel.recompute"},
      {"device: tpu", "device"},
      {"memory: {allocator: slab}", "memory.allocator"},
      {"snapshot: {redundancy: raid}", "snapshot.redundancy"},
      {"elastic: {on_change: panic}", "elastic.on_change"},
  };
  for (const Case& c : cases) {
    std::string yaml = std::string(c.yaml) + "\n";
    if (yaml.find("data:") == std::string::npos)
      yaml += "data: {path: t.bin}\n";
    else
      yaml = "data: {path: t.bin, " + yaml.substr(7);
    EXPECT_EQ(parse_error(yaml).field(), c.field) << yaml;
  }
  EXPECT_EQ(parse_error("data: {}\n").field(), "data.path");
}

TEST(JobSpecBadInput, InconsistentValues) {
  struct Case {
    const char* yaml;
    const char* field;
  };
  const Case cases[] = {
      {"model: {dim: 64, heads: 3}", "model.heads"},
      {"train: {global_batch: 8, micro_batch: 3}", "train.micro_batch"},
      {"model: {arch: moe-gpt, moe: {experts: 4, top_k: 5}}", "model.moe.top_k"},
      {"model: {arch: moe-gpt, layers: 2, moe: {experts: 4, every: 3}}", "model.moe.every"},
      {"model: {arch: gpt, moe: {experts: 4}}", "model.arch"},
      {"train: {lr: 0.001, min_lr: 0.01}", "train.min_lr"},
      {"parallel: {tp: 3}", "parallel.tp"},  // 4 heads
      {"parallel: {ep: 2}", "parallel.ep"},  // not an MoE model
      {"model: {arch: moe-gpt, moe: {experts: 4}}\nparallel: {ep: 3}", "parallel.ep"},
      {"parallel: {pp: 3}", "parallel.pp"},  // 2 layers
      {"train: {global_batch: 8, micro_batch: 4}\nparallel: {dp: 3}", "parallel.dp"},
      {"parallel: {pipeline: {virtual_stages: 2}}", "parallel.pipeline.virtual_stages"},
      {"parallel: {pp: 2, pipeline: {layout: [[0], [0, 1]]}}", "parallel.pipeline.layout"},
      {"parallel: {pp: 1, pipeline: {layout: [[0], [1]]}}", "parallel.pipeline.layout"},
      {"checkpoint: {every: 10}", "checkpoint.dir"},
      {"elastic: {min_nodes: 3, max_nodes: 2}", "elastic.max_nodes"},
      {"train: {eval_every: 5}\ndata: {path: t.bin, val_fraction: 0}", "train.eval_every"},
      // Llama: grouped heads, rotary pairs, tp by KV heads, and each family's own keys.
      {"model: {arch: llama, heads: 4, kv_heads: 3}", "model.kv_heads"},
      {"model: {arch: llama, dim: 24, heads: 8}", "model.heads"},  // head size 3
      {"model: {arch: llama, heads: 4, kv_heads: 2}\nparallel: {tp: 4}", "parallel.tp"},
      {"model: {arch: gpt, kv_heads: 2}", "model.kv_heads"},
      {"model: {rope_theta: 5000}", "model.rope_theta"},  // arch defaults to gpt
      {"model: {arch: moe-gpt, tie_embeddings: true, moe: {experts: 2}}", "model.tie_embeddings"},
      {"model: {arch: llama, mlp_ratio: 4}", "model.mlp_ratio"},
      {"model: {arch: llama, moe: {experts: 4}}", "model.moe"},
      {"model: {arch: llama, norm_eps: 0}", "model.norm_eps"},
      {"model: {arch: llama, rope_theta: -1}", "model.rope_theta"},
  };
  for (const Case& c : cases) {
    std::string yaml = std::string(c.yaml) + "\n";
    if (yaml.find("data:") == std::string::npos) yaml += "data: {path: t.bin}\n";
    EXPECT_EQ(parse_error(yaml).field(), c.field) << yaml;
  }
  // The consistent neighbours of those cases pass.
  EXPECT_NO_THROW(
      parse_job_spec("data: {path: t}\nparallel: {tp: 2, pp: 2, dp: 2}\n"
                     "train: {global_batch: 8, micro_batch: 4}\n",
                     "/"));
  EXPECT_NO_THROW(
      parse_job_spec("data: {path: t}\nparallel: {pp: 2, pipeline: {layout: [[0], [1]]}}", "/"));
  EXPECT_NO_THROW(parse_job_spec(
      "data: {path: t}\nmodel: {arch: llama, heads: 4, kv_heads: 2}\nparallel: {tp: 2}", "/"));
}

TEST(JobSpec, LlamaKeysDefaultAsLlama) {
  JobSpec s = parse_job_spec("model: {arch: llama, dim: 64, heads: 4}\ndata: {path: t}\n", "/");
  EXPECT_EQ(s.model.kv(), 4);           // kv_heads: heads
  EXPECT_EQ(s.model.mlp_width(), 176);  // 2/3 of 4*64 = 170.7, rounded up to 16
  EXPECT_EQ(s.model.rope_theta, 10000.0);
  EXPECT_EQ(s.model.norm_eps, 1e-5);
  EXPECT_FALSE(s.model.tie_embeddings);
  // The rule of shared/reference/make_reference.py: ((8*dim // 3) + 15) // 16 * 16.
  EXPECT_EQ(ModelSpec::llama_ffn_dim(4096), 10928);
  EXPECT_EQ(ModelSpec::llama_ffn_dim(48), 128);
  s = parse_job_spec(
      "model: {arch: llama, dim: 64, heads: 4, kv_heads: 1, ffn_dim: 100, rope_theta: 5.0e5,"
      " norm_eps: 1.0e-6, tie_embeddings: true}\ndata: {path: t}\n",
      "/");
  EXPECT_EQ(s.model.kv(), 1);
  EXPECT_EQ(s.model.mlp_width(), 100);
  EXPECT_EQ(s.model.rope_theta, 5e5);
  EXPECT_EQ(s.model.norm_eps, 1e-6);
  EXPECT_TRUE(s.model.tie_embeddings);
  // GPT keeps its MLP rule and its KV heads are its heads.
  s = parse_job_spec(kMinimal, "/");
  EXPECT_EQ(s.model.mlp_width(), 4 * 64);
  EXPECT_EQ(s.model.kv(), s.model.heads);
}

TEST(JobSpecBadInput, LlamaErrorsNameTheFieldAndTheFix) {
  ConfigError e = parse_error("model: {arch: llama, heads: 4, kv_heads: 3}\ndata: {path: t}\n");
  EXPECT_NE(msg(e).find("must divide model.heads (4)"), std::string::npos) << msg(e);
  e = parse_error("model: {arch: llama, dim: 24, heads: 8}\ndata: {path: t}\n");
  EXPECT_NE(msg(e).find("must be even for rotary"), std::string::npos) << msg(e);
  e = parse_error("model: {arch: llama, heads: 8, kv_heads: 2}\nparallel: {tp: 4}\ndata: {path: t}\n");
  EXPECT_NE(msg(e).find("tp (4) must divide model.kv_heads (2)"), std::string::npos) << msg(e);
  e = parse_error("model: {ffn_dim: 128}\ndata: {path: t}\n");
  EXPECT_EQ(e.field(), "model.ffn_dim");
  EXPECT_NE(msg(e).find("set arch: llama or drop it"), std::string::npos) << msg(e);
  e = parse_error("model: {arch: llama, mlp_ratio: 4}\ndata: {path: t}\n");
  EXPECT_NE(msg(e).find("ffn_dim"), std::string::npos) << msg(e);
  // --set reaches the same checks.
  e = parse_error("model: {arch: llama}\ndata: {path: t}\n", {"model.kv_heads=3"});
  EXPECT_EQ(e.field(), "model.kv_heads");
}

TEST(JobSpecBadInput, EveryIntegerHasAnUpperBound) {
  struct Case {
    const char* yaml;
    const char* field;
  };
  // One past each documented bound (core/config/limits.h), and the values from issue 12.
  const Case cases[] = {
      {"train: {threads: 100000}", "train.threads"},
      {"train: {threads: 1025}", "train.threads"},
      {"train: {eval_batches: 1099511627776}", "train.eval_batches"},  // 2^40
      {"train: {steps: 1099511627777}", "train.steps"},
      {"train: {global_batch: 1073741824, micro_batch: 1}", "train.global_batch"},  // 2^30
      {"train: {log_every: 1099511627777}", "train.log_every"},
      {"train: {eval_every: 1099511627777}", "train.eval_every"},
      {"parallel: {pipeline: {micro_batches: 1073741824}}", "parallel.pipeline.micro_batches"},
      {"parallel: {pipeline: {virtual_stages: 65537}}", "parallel.pipeline.virtual_stages"},
      {"parallel: {tp: 65537}", "parallel.tp"},
      {"parallel: {dp: 65537}", "parallel.dp"},
      {"model: {layers: 1048577}", "model.layers"},
      {"model: {dim: 1048577, heads: 1}", "model.dim"},
      {"model: {heads: 65537}", "model.heads"},
      {"model: {vocab: 16777217}", "model.vocab"},
      {"model: {seq_len: 1048577}", "model.seq_len"},
      {"model: {mlp_ratio: 65}", "model.mlp_ratio"},
      {"model: {arch: moe-gpt, moe: {experts: 65537}}", "model.moe.experts"},
      {"checkpoint: {dir: c, every: 1099511627777}", "checkpoint.every"},
      {"checkpoint: {keep: 1000001}", "checkpoint.keep"},
      {"snapshot: {every: 1099511627777}", "snapshot.every"},
      {"snapshot: {ec: {k: 200, m: 56}}", "snapshot.ec.m"},
      {"elastic: {min_nodes: 1, max_nodes: 65537}", "elastic.max_nodes"},
  };
  for (const Case& c : cases) {
    std::string yaml = std::string(c.yaml) + "\ndata: {path: t.bin}\n";
    ConfigError e = parse_error(yaml);
    EXPECT_EQ(e.field(), c.field) << yaml;
    EXPECT_NE(msg(e).find("expected an integer in ["), std::string::npos) << msg(e);
  }
  // The bounds themselves pass.
  EXPECT_NO_THROW(
      parse_job_spec("data: {path: t}\ntrain: {threads: 1024, eval_batches: 1048576}", "/"));
}

TEST(JobSpecBadInput, SizeProductsNeverOverflow) {
  // Each factor is in range; their product is not, and would overflow int64 or exceed any
  // machine: refused naming every factor.
  struct Case {
    const char* yaml;
    const char* field;
    const char* named;
  };
  const Case cases[] = {
      {"model: {layers: 1048576, dim: 1048576, heads: 1, mlp_ratio: 64}", "model", "model.dim"},
      {"model: {vocab: 16777216, seq_len: 1048576}\ntrain: {global_batch: 1048576, "
       "micro_batch: 1048576}",
       "train.micro_batch", "model.vocab"},
      {"model: {seq_len: 1048576, heads: 65536, dim: 65536}\ntrain: {global_batch: 1024, "
       "micro_batch: 1024}",
       "train.micro_batch", "model.seq_len"},
      {"train: {steps: 1099511627776, global_batch: 1048576, micro_batch: 1}", "train.steps",
       "train.global_batch"},
  };
  for (const Case& c : cases) {
    std::string yaml = std::string(c.yaml) + "\ndata: {path: t.bin}\n";
    ConfigError e = parse_error(yaml);
    EXPECT_EQ(e.field(), c.field) << yaml;
    EXPECT_NE(msg(e).find(c.named), std::string::npos) << msg(e);
    EXPECT_NE(msg(e).find("exceeds 2^53"), std::string::npos) << msg(e);
  }
  // Large but meaningful sizes pass (what does not fit memory is the memory check's call).
  EXPECT_NO_THROW(parse_job_spec("data: {path: t}\nmodel: {layers: 100000}", "/"));
  EXPECT_NO_THROW(parse_job_spec("data: {path: t}\nmodel: {dim: 1000000, heads: 1}", "/"));
}

TEST(JobSpecBadInput, DuplicateKeysNameTheKeyAndBothLines) {
  ConfigError e = parse_error("model: {layers: 2}\ndata: {path: t}\nmodel: {layers: 4}\n");
  EXPECT_EQ(e.field(), "model");
  EXPECT_NE(msg(e).find("lines 1 and 3"), std::string::npos) << msg(e);
  e = parse_error("data: {path: t}\ntrain:\n  steps: 5\n  lr: 0.1\n  steps: 7\n");
  EXPECT_EQ(e.field(), "train.steps");
  EXPECT_NE(msg(e).find("lines 3 and 5"), std::string::npos) << msg(e);
  // Inside a flow mapping, and in a nested section.
  EXPECT_EQ(parse_error("data: {path: t, path: u}").field(), "data.path");
  EXPECT_EQ(parse_error("data: {path: t}\nsnapshot: {ec: {k: 2, k: 3}}").field(), "snapshot.ec.k");
  // The file names itself in the message.
  TempDir dir;
  std::string cfg = dir.write("dup.yaml", "data: {path: t}\ndata: {path: u}\n");
  e = expect_config_error([&] { load_job_spec(cfg); });
  EXPECT_EQ(e.field(), "data");
  EXPECT_NE(msg(e).find("lines 1 and 2 of " + cfg), std::string::npos) << msg(e);
  // --set over a key the file has is an override, not a duplicate.
  EXPECT_EQ(
      parse_job_spec("data: {path: t}\ntrain: {steps: 5}", "/", {"train.steps=9"}).train.steps, 9);
}

TEST(JobSpec, WarmupLongerThanTheRunIsClippedWithANote) {
  JobSpec s = parse_job_spec("data: {path: t}\ntrain: {steps: 100, warmup_steps: 10}", "/",
                             {"train.steps=5"});
  EXPECT_EQ(s.train.steps, 5);
  EXPECT_EQ(s.train.warmup_steps, 5);
  ASSERT_EQ(s.notes.size(), 1u);
  EXPECT_EQ(s.notes[0], "train.warmup_steps 10 > train.steps 5: warming up over all 5 steps");
  // A warm-up that fits leaves no note; a negative one is still refused.
  EXPECT_TRUE(
      parse_job_spec("data: {path: t}\ntrain: {steps: 5, warmup_steps: 5}", "/").notes.empty());
  EXPECT_EQ(parse_error("data: {path: t}\ntrain: {warmup_steps: -1}").field(),
            "train.warmup_steps");
  // Built in code and not clipped: validation still names the field.
  JobSpec bad = parse_job_spec(kMinimal, "/");
  bad.train.warmup_steps = bad.train.steps + 1;
  EXPECT_EQ(expect_config_error([&] { validate_job_spec(bad); }).field(), "train.warmup_steps");
}

TEST(JobSpec, MemoryLimitIsAutoOrPositiveGib) {
  EXPECT_EQ(parse_job_spec(kMinimal, "/").memory.limit_gib, 0);  // auto
  EXPECT_EQ(parse_job_spec("data: {path: t}\nmemory: {limit_gib: auto}", "/").memory.limit_gib, 0);
  EXPECT_EQ(parse_job_spec(kMinimal, "/", {"memory.limit_gib=2.5"}).memory.limit_gib, 2.5);
  for (const char* bad : {"0", "-1", "lots"}) {
    ConfigError e = parse_error(kMinimal, {std::string("memory.limit_gib=") + bad});
    EXPECT_EQ(e.field(), "memory.limit_gib") << bad;
  }
  // The dump keeps it.
  JobSpec s = parse_job_spec(kMinimal, "/", {"memory.limit_gib=3"});
  EXPECT_EQ(parse_job_spec(job_spec_to_yaml(s), "/").memory.limit_gib, 3);
}

// snapshot.every: auto (the interval chosen at run time) from the file or --set, kept by the
// dump; below 0 is still refused naming the key.
TEST(JobSpec, SnapshotEveryTakesAuto) {
  JobSpec s = parse_job_spec("data: {path: t}\nsnapshot: {every: auto}", "/");
  EXPECT_EQ(s.snapshot.every, SnapshotSpec::kAuto);
  EXPECT_TRUE(s.snapshot.enabled());
  EXPECT_NE(job_spec_to_yaml(s).find("every: auto"), std::string::npos) << job_spec_to_yaml(s);
  EXPECT_EQ(parse_job_spec(job_spec_to_yaml(s), "/").snapshot.every, SnapshotSpec::kAuto);
  EXPECT_EQ(parse_job_spec(kMinimal, "/", {"snapshot.every=auto"}).snapshot.every,
            SnapshotSpec::kAuto);
  EXPECT_FALSE(parse_job_spec(kMinimal, "/").snapshot.enabled());
  EXPECT_EQ(parse_error("data: {path: t}\nsnapshot: {every: -1}").field(), "snapshot.every");
  EXPECT_EQ(parse_error("data: {path: t}\nsnapshot: {every: sometimes}").field(), "snapshot.every");
}

TEST(JobSpecOverrides, SetAppliesScalarsListsAndAuto) {
  JobSpec s = parse_job_spec("data: {path: t.bin}\ntrain: {steps: 100}\nparallel: {dp: 2}\n", "/b",
                             {"train.steps=20", "train.betas=[0.8, 0.9]", "parallel.dp=auto",
                              "snapshot.ec.k=3", "model.moe.top_k=1", "data.path=rel/x.bin"});
  EXPECT_EQ(s.train.steps, 20);
  EXPECT_DOUBLE_EQ(s.train.betas[0], 0.8);
  EXPECT_EQ(s.parallel.dp, 0);
  EXPECT_EQ(s.snapshot.ec_k, 3);  // sections absent from the file are created
  EXPECT_EQ(s.model.moe.top_k, 1);
  EXPECT_EQ(s.data.path, "rel/x.bin");  // command-line paths stay relative to the cwd
  // The last --set of a key wins.
  EXPECT_EQ(parse_job_spec(kMinimal, "/", {"train.steps=5", "train.steps=6"}).train.steps, 6);
}

TEST(JobSpecBadInput, BadSetOverrides) {
  ConfigError e = parse_error(kMinimal, {"train.steps"});
  EXPECT_EQ(e.field(), "--set");
  EXPECT_NE(msg(e).find("KEY=VALUE"), std::string::npos) << msg(e);
  EXPECT_EQ(parse_error(kMinimal, {"=3"}).field(), "--set");
  EXPECT_EQ(parse_error(kMinimal, {"train..steps=3"}).field(), "--set");

  e = parse_error(kMinimal, {"train.stepz=3"});
  EXPECT_EQ(e.field(), "train.stepz");
  EXPECT_NE(msg(e).find("did you mean 'train.steps'?"), std::string::npos) << msg(e);

  EXPECT_EQ(parse_error(kMinimal, {"train.lr=abc"}).field(), "train.lr");
  EXPECT_EQ(parse_error(kMinimal, {"train.betas=[0.9,"}).field(), "train.betas");
  e = parse_error(kMinimal, {"device.kind=gpu"});
  EXPECT_EQ(e.field(), "device.kind");
  EXPECT_NE(msg(e).find("not a section"), std::string::npos) << msg(e);
}

TEST(JobSpecFile, LoadResolvesAgainstFileFolderAndNamesRun) {
  TempDir dir;
  std::string cfg = dir.write("my-job.yaml", "data: {path: data/t.bin, val_path: /abs/v.bin}\n");
  JobSpec s = load_job_spec(cfg);
  EXPECT_EQ(s.data.path, (dir.path() / "data/t.bin").string());
  EXPECT_EQ(s.data.val_path, "/abs/v.bin");
  EXPECT_EQ(s.train.out_dir, "runs/my-job");
  EXPECT_EQ(s.source_path, fs::absolute(cfg).lexically_normal().string());
  std::string cfg2 = dir.write("b.yaml", "data: {path: t.bin}\ntrain: {out_dir: out}\n");
  EXPECT_EQ(load_job_spec(cfg2).train.out_dir, (dir.path() / "out").string());
  EXPECT_EQ(load_job_spec(cfg2, {"train.out_dir=o2"}).train.out_dir, "o2");
}

TEST(JobSpecFile, MissingFileAndSyntaxErrorNameConfig) {
  TempDir dir;
  ConfigError e = expect_config_error([&] { load_job_spec((dir.path() / "nope.yaml").string()); });
  EXPECT_EQ(e.field(), "--config");
  EXPECT_NE(msg(e).find("nope.yaml"), std::string::npos);
  std::string bad = dir.write("bad.yaml", "data:\n  path: [unclosed\n");
  e = expect_config_error([&] { load_job_spec(bad); });
  EXPECT_EQ(e.field(), "--config");
  EXPECT_NE(msg(e).find("bad.yaml:"), std::string::npos) << msg(e);
}

bool llama_only(const std::string& key) {
  return key == "kv_heads" || key == "ffn_dim" || key == "rope_theta" || key == "norm_eps" ||
         key == "tie_embeddings";
}

TEST(JobSpecDump, YamlRoundTripsEveryField) {
  JobSpec s = parse_job_spec(R"(
model: {arch: moe-gpt, layers: 4, dim: 96, heads: 6, moe: {experts: 6, top_k: 3, every: 2,
        capacity_factor: 1.5, balance: aux_loss_global, aux_coef: 0.003}}
data: {path: /d/t.bin, order: sequential, val_fraction: 0.1}
train: {lr: 0.0003, min_lr: 3.0e-5, eps: 1.0e-8, betas: [0.9, 0.999], seed: 18446744073709551615,
        out_dir: /runs/x, eval_every: 3}
parallel: {tp: 3, pp: 2, pipeline: {layout: [[0, 1], [2, 3]]}}
checkpoint: {dir: /ck, every: 5, keep: 2}
)",
                             "/");
  std::string yaml = job_spec_to_yaml(s);
  JobSpec back = parse_job_spec(yaml, "/elsewhere");
  EXPECT_EQ(job_spec_to_yaml(back), yaml);
  EXPECT_EQ(back.train.lr, s.train.lr);  // bitwise: shortest round-trip formatting
  EXPECT_EQ(back.train.min_lr, s.train.min_lr);
  EXPECT_EQ(back.train.seed, s.train.seed);
  EXPECT_EQ(back.model.moe.aux_coef, s.model.moe.aux_coef);
  EXPECT_EQ(back.parallel.pipeline.layout, s.parallel.pipeline.layout);
  EXPECT_EQ(back.parallel.dp, 0);
  EXPECT_NE(yaml.find("dp: auto"), std::string::npos) << yaml;

  // Every key the schema allows appears in the dump, so nothing is silently dropped.
  YAML::Node root = YAML::Load(yaml);
  for (const auto& [section, keys] : job_spec_schema()) {
    YAML::Node node = root;
    std::string rest = section;
    while (!rest.empty()) {
      size_t dot = rest.find('.');
      node.reset(node[rest.substr(0, dot)]);
      rest = dot == std::string::npos ? "" : rest.substr(dot + 1);
    }
    for (const std::string& k : keys) {
      if (section == "model" && llama_only(k)) continue;  // refused with arch moe-gpt
      EXPECT_TRUE(node[k].IsDefined()) << section << "." << k;
    }
  }
}

TEST(JobSpecDump, LlamaYamlRoundTripsWithResolvedDefaults) {
  JobSpec s = parse_job_spec(
      "model: {arch: llama, dim: 64, heads: 4, kv_heads: 2, rope_theta: 500000, tie_embeddings: true}\n"
      "data: {path: /t}\ntrain: {out_dir: /runs/x}\n",
      "/");
  std::string yaml = job_spec_to_yaml(s);
  JobSpec back = parse_job_spec(yaml, "/elsewhere");
  EXPECT_EQ(job_spec_to_yaml(back), yaml);
  YAML::Node model = YAML::Load(yaml)["model"];
  for (const char* k : {"kv_heads", "ffn_dim", "rope_theta", "norm_eps", "tie_embeddings"})
    EXPECT_TRUE(model[k].IsDefined()) << k << "\n" << yaml;
  EXPECT_FALSE(model["mlp_ratio"].IsDefined()) << yaml;
  EXPECT_EQ(model["ffn_dim"].as<int64_t>(), 176);  // the resolved default
  EXPECT_EQ(back.model.rope_theta, 500000.0);
  EXPECT_TRUE(back.model.tie_embeddings);
}

TEST(JobSpecDump, ModelHashCoversShapesOnly) {
  ModelSpec a;
  ModelSpec b = a;
  EXPECT_EQ(model_config_hash(a), model_config_hash(b));
  b.dim = 128;
  EXPECT_NE(model_config_hash(a), model_config_hash(b));
  b = a;
  b.heads = 8;
  EXPECT_NE(model_config_hash(a), model_config_hash(b));
  ModelSpec m = a;
  m.arch = "moe-gpt";
  m.moe.experts = 4;
  ModelSpec m2 = m;
  m2.moe.experts = 8;
  EXPECT_NE(model_config_hash(m), model_config_hash(m2));
  m2 = m;
  m2.moe.aux_coef = 0.5;  // a training knob, not a shape
  m2.moe.top_k = 1;
  EXPECT_EQ(model_config_hash(m), model_config_hash(m2));
  // Llama: KV heads, the SwiGLU width and a tied head change the parameters; rotary theta
  // and the norm epsilon do not.
  ModelSpec l = a;
  l.arch = "llama";
  EXPECT_NE(model_config_hash(l), model_config_hash(a));
  for (auto change : std::vector<std::function<void(ModelSpec&)>>{
           [](ModelSpec& x) { x.kv_heads = 2; }, [](ModelSpec& x) { x.ffn_dim = 128; },
           [](ModelSpec& x) { x.tie_embeddings = true; }}) {
    ModelSpec l2 = l;
    change(l2);
    EXPECT_NE(model_config_hash(l), model_config_hash(l2));
  }
  ModelSpec l3 = l;
  l3.rope_theta = 5e5;
  l3.norm_eps = 1e-6;
  l3.kv_heads = l.heads;  // the default, written out
  l3.ffn_dim = ModelSpec::llama_ffn_dim(l.dim);
  EXPECT_EQ(model_config_hash(l), model_config_hash(l3));
}

TEST(JobSpecFile, EveryShippedConfigParses) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(WEFT_SOURCE_DIR) / "configs")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    JobSpec s = load_job_spec(e.path().string());
    EXPECT_FALSE(s.data.path.empty());
    ++n;
  }
  EXPECT_GE(n, 3);
  JobSpec small = load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/gpt-small.yaml");
  EXPECT_EQ(small.model.layers, 4);
  EXPECT_EQ(small.model.dim, 128);
  EXPECT_EQ(small.train.steps, 200);
  EXPECT_EQ(small.train.eval_every, 25);
  EXPECT_EQ(small.data.path, "/usr/share/games/fortunes");
}

TEST(JobSpecFile, ReferenceConfigsParse) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(WEFT_REFERENCE_DIR)) {
    fs::path cfg = e.path() / "config.yaml";
    if (!fs::exists(cfg)) continue;
    SCOPED_TRACE(cfg.string());
    JobSpec s = load_job_spec(cfg.string());
    EXPECT_EQ(s.data.path, (fs::absolute(e.path()) / "tokens.bin").lexically_normal().string());
    EXPECT_TRUE(fs::exists(s.data.path));
    EXPECT_EQ(s.data.order, "sequential");
    EXPECT_EQ(s.train.steps, 20);
    EXPECT_EQ(s.train.out_dir, "runs/" + e.path().filename().string());
    ++n;
  }
  EXPECT_GE(n, 3);  // gpt-tiny, moe-tiny, llama-tiny
}

}  // namespace
}  // namespace weft::core
