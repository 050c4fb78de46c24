// Which tokens each sequence of each step reads. Offsets are pure functions of
// (step, global sequence index, seed): never of rank, world size or micro-batching, so
// every parallel layout and every world size sees the same batches (invariants 1, 2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/job_spec.h"

namespace weft::core::data {

enum class Order { kSequential, kShuffled };
Order parse_order(const std::string& s);  // "sequential" | "shuffled"; ConfigError otherwise

// Window starts for training. With N tokens, seq_len T and global batch B, sequence b of
// step s (its global index g = s*B + b) starts at
//   sequential: o = (g * T) mod (N - T)                    (shared/reference/README.md)
//   shuffled:   o = T * perm_e[g mod W], e = g / W, W = (N - 1) / T non-overlapping windows,
// where perm_e is a Fisher-Yates permutation of [0, W) driven by CounterRng(seed,
// kShuffleStream + e). Either way x = tokens[o, o+T) and y = tokens[o+1, o+T+1).
// Thread-safe; copies share the cache of permutations.
class BatchSampler {
 public:
  BatchSampler(int64_t num_tokens, int64_t seq_len, int64_t global_batch, Order order,
               uint64_t seed);

  int64_t offset(int64_t step, int64_t b) const;
  // Complete passes over the data before sequence b of `step` (the metrics' "epoch").
  int64_t epoch(int64_t step, int64_t b = 0) const;
  int64_t num_windows() const { return windows_; }
  int64_t num_tokens() const { return tokens_; }
  Order order() const { return order_; }

  // The permutation of window indices used in epoch `e` (shuffled order only).
  std::shared_ptr<const std::vector<uint32_t>> permutation(int64_t e) const;

  // RNG stream base, so that data order never shares draws with parameter init.
  static constexpr uint64_t kShuffleStream = 0x64617461ull << 32;  // "data"

 private:
  struct Cache;
  int64_t tokens_, seq_len_, global_batch_, windows_;
  Order order_;
  uint64_t seed_;
  std::shared_ptr<Cache> cache_;
};

// The training and validation tokens of a job, with the sampler over the training split.
class TokenDataset {
 public:
  // Reads data.path (and data.val_path), checks every token < model.vocab, and holds out
  // the last data.val_fraction of data.path for validation when data.val_path is empty
  // and train.eval_every > 0. ConfigErrors name the data field at fault.
  static TokenDataset load(const JobSpec& spec);

  TokenDataset(std::vector<int32_t> train, std::vector<int32_t> val, int64_t seq_len,
               int64_t global_batch, Order order, uint64_t seed, int64_t val_batches);

  const std::vector<int32_t>& train_tokens() const { return train_; }
  const std::vector<int32_t>& val_tokens() const { return val_; }
  const BatchSampler& sampler() const { return sampler_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t global_batch() const { return global_batch_; }

  // Fills x and y, each (n, T) row-major int32, with sequences b0 .. b0+n-1 of the global
  // batch of `step`. A micro-batch j of size mb on any rank is fill_train(s, j*mb, mb...).
  void fill_train(int64_t step, int64_t b0, int64_t n, int32_t* x, int32_t* y) const;

  // Validation: num_val_batches() fixed batches of global_batch sequences whose windows
  // are spread evenly over the validation tokens; the same every time they are evaluated.
  bool has_val() const { return !val_.empty(); }
  int64_t num_val_batches() const { return has_val() ? val_batches_ : 0; }
  int64_t val_offset(int64_t batch, int64_t b) const;
  void fill_val(int64_t batch, int64_t b0, int64_t n, int32_t* x, int32_t* y) const;

 private:
  std::vector<int32_t> train_, val_;
  int64_t seq_len_, global_batch_, val_batches_;
  BatchSampler sampler_;
};

}  // namespace weft::core::data
