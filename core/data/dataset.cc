// Batch offsets (sequential and counter-based shuffled), the train/validation split and
// filling x/y buffers.
#include "core/data/dataset.h"

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "base/check.h"
#include "base/error.h"
#include "core/data/token_file.h"
#include "core/rng.h"

namespace weft::core::data {

Order parse_order(const std::string& s) {
  if (s == "sequential") return Order::kSequential;
  if (s == "shuffled") return Order::kShuffled;
  throw ConfigError("data.order", "expected shuffled|sequential, got '" + s + "'");
}

// Permutations of the last few epochs: a step's sequences straddle at most two epochs,
// and worker threads asking for the same epoch share one copy.
struct BatchSampler::Cache {
  std::mutex mu;
  std::map<int64_t, std::shared_ptr<const std::vector<uint32_t>>> by_epoch;
};

BatchSampler::BatchSampler(int64_t num_tokens, int64_t seq_len, int64_t global_batch, Order order,
                           uint64_t seed)
    : tokens_(num_tokens),
      seq_len_(seq_len),
      global_batch_(global_batch),
      windows_(0),
      order_(order),
      seed_(seed),
      cache_(std::make_shared<Cache>()) {
  WEFT_CHECK(seq_len >= 1 && global_batch >= 1, "seq_len ", seq_len, " global_batch ",
             global_batch);
  if (num_tokens < seq_len + 1)
    throw ConfigError("data.path", "the training split holds " + std::to_string(num_tokens) +
                                       " tokens; one sequence needs model.seq_len + 1 = " +
                                       std::to_string(seq_len + 1));
  windows_ = (num_tokens - 1) / seq_len;
  WEFT_CHECK(windows_ <= int64_t(UINT32_MAX), "too many windows: ", windows_);
}

std::shared_ptr<const std::vector<uint32_t>> BatchSampler::permutation(int64_t e) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  auto it = cache_->by_epoch.find(e);
  if (it != cache_->by_epoch.end()) return it->second;
  auto perm = std::make_shared<std::vector<uint32_t>>(size_t(windows_));
  for (int64_t i = 0; i < windows_; ++i) (*perm)[size_t(i)] = uint32_t(i);
  // Fisher-Yates; draw i is a pure function of (seed, epoch, i). j = floor(r * (i+1) / 2^64)
  // with a 64-bit r keeps the modulo bias below 2^-32 for any realistic window count.
  CounterRng rng(seed_, kShuffleStream + uint64_t(e));
  for (int64_t i = windows_ - 1; i > 0; --i) {
    uint64_t r = (uint64_t(rng.u32(2 * uint64_t(i))) << 32) | rng.u32(2 * uint64_t(i) + 1);
    auto j = int64_t((static_cast<unsigned __int128>(r) * uint64_t(i + 1)) >> 64);
    std::swap((*perm)[size_t(i)], (*perm)[size_t(j)]);
  }
  if (cache_->by_epoch.size() >= 3) cache_->by_epoch.erase(cache_->by_epoch.begin());
  cache_->by_epoch.emplace(e, perm);
  return perm;
}

int64_t BatchSampler::offset(int64_t step, int64_t b) const {
  WEFT_CHECK(step >= 0 && b >= 0 && b < global_batch_, "step ", step, " sequence ", b,
             " of a global batch of ", global_batch_);
  const int64_t g = step * global_batch_ + b;
  if (order_ == Order::kSequential) {
    // (g*T) can exceed int64 only after ~1e18 tokens; reduce g first anyway.
    const int64_t span = tokens_ - seq_len_;
    return int64_t((static_cast<unsigned __int128>(g) * uint64_t(seq_len_)) % uint64_t(span));
  }
  auto perm = permutation(g / windows_);
  return int64_t((*perm)[size_t(g % windows_)]) * seq_len_;
}

int64_t BatchSampler::epoch(int64_t step, int64_t b) const {
  const int64_t g = step * global_batch_ + b;
  if (order_ == Order::kSequential) return g * seq_len_ / (tokens_ - seq_len_);
  return g / windows_;
}

TokenDataset::TokenDataset(std::vector<int32_t> train, std::vector<int32_t> val, int64_t seq_len,
                           int64_t global_batch, Order order, uint64_t seed, int64_t val_batches)
    : train_(std::move(train)),
      val_(std::move(val)),
      seq_len_(seq_len),
      global_batch_(global_batch),
      val_batches_(val_batches),
      sampler_(int64_t(train_.size()), seq_len, global_batch, order, seed) {
  if (!val_.empty() && int64_t(val_.size()) < seq_len + 1)
    throw ConfigError("data.val_path", "the validation split holds " + std::to_string(val_.size()) +
                                           " tokens; one sequence needs model.seq_len + 1 = " +
                                           std::to_string(seq_len + 1));
}

TokenDataset TokenDataset::load(const JobSpec& spec) {
  const DataSpec& d = spec.data;
  const int64_t T = spec.model.seq_len;
  std::vector<int32_t> tokens = read_token_file(d.path, "data.path");
  check_tokens_fit_vocab(tokens, spec.model.vocab, "data.path", d.path);
  std::vector<int32_t> val;
  if (!d.val_path.empty()) {
    val = read_token_file(d.val_path, "data.val_path");
    check_tokens_fit_vocab(val, spec.model.vocab, "data.val_path", d.val_path);
  } else if (spec.train.eval_every > 0 && d.val_fraction > 0) {
    const auto n = int64_t(tokens.size());
    const auto n_val = int64_t(std::floor(double(n) * d.val_fraction));
    if (n_val < T + 1)
      throw ConfigError(
          "data.val_fraction",
          "holds out " + std::to_string(n_val) + " of the " + std::to_string(n) + " tokens of '" +
              d.path + "'; a validation sequence needs seq_len + 1 = " + std::to_string(T + 1) +
              "; raise val_fraction or set data.val_path");
    if (n - n_val < T + 1)
      throw ConfigError("data.val_fraction", "leaves " + std::to_string(n - n_val) +
                                                 " training tokens; one sequence needs " +
                                                 std::to_string(T + 1));
    val.assign(tokens.end() - n_val, tokens.end());
    tokens.resize(size_t(n - n_val));
  }
  if (int64_t(tokens.size()) < T + 1)
    throw ConfigError("data.path", "'" + d.path + "' holds " + std::to_string(tokens.size()) +
                                       " tokens; one sequence needs model.seq_len + 1 = " +
                                       std::to_string(T + 1));
  return TokenDataset(std::move(tokens), std::move(val), T, spec.train.global_batch,
                      parse_order(d.order), spec.train.seed, spec.train.eval_batches);
}

void TokenDataset::fill_train(int64_t step, int64_t b0, int64_t n, int32_t* x, int32_t* y) const {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* src = train_.data() + sampler_.offset(step, b0 + i);
    std::memcpy(x + i * seq_len_, src, size_t(seq_len_) * sizeof(int32_t));
    std::memcpy(y + i * seq_len_, src + 1, size_t(seq_len_) * sizeof(int32_t));
  }
}

int64_t TokenDataset::val_offset(int64_t batch, int64_t b) const {
  WEFT_CHECK(has_val(), "no validation split");
  WEFT_CHECK(batch >= 0 && batch < val_batches_ && b >= 0 && b < global_batch_, "validation batch ",
             batch, " sequence ", b);
  // Evenly spread starts over [0, Nv - T): representative of the whole split, and fixed.
  const int64_t total = val_batches_ * global_batch_;
  const int64_t span = int64_t(val_.size()) - seq_len_;
  return int64_t((static_cast<unsigned __int128>(batch * global_batch_ + b) * uint64_t(span)) /
                 uint64_t(total));
}

void TokenDataset::fill_val(int64_t batch, int64_t b0, int64_t n, int32_t* x, int32_t* y) const {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* src = val_.data() + val_offset(batch, b0 + i);
    std::memcpy(x + i * seq_len_, src, size_t(seq_len_) * sizeof(int32_t));
    std::memcpy(y + i * seq_len_, src + 1, size_t(seq_len_) * sizeof(int32_t));
  }
}

}  // namespace weft::core::data
