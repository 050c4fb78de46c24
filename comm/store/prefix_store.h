// PrefixStore: a namespace inside another store ("epoch/7" turns key "rank0" into
// "epoch/7/rank0"), so each membership epoch's keys cannot collide with the last one's.
#pragma once

#include <memory>

#include "comm/store/store.h"

namespace weft::comm {

// Forwards every call to `base` with "<prefix>/" in front of each key; errors name the full
// keys. num_keys() counts only this namespace (nested prefixes included). Thread-safe as
// `base` is; shares `base` (several PrefixStores over one connection are fine), and the
// timeout is the base store's, so set_timeout() changes it for every sharer.
class PrefixStore : public Store {
 public:
  // Throws CommError on an empty prefix (it would not isolate anything).
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const Bytes& value, std::optional<Millis> ttl = {}) override;
  void set(const std::string& key, const Bytes& value, const SetOptions& options) override;
  bool binds_to_connection() const override { return base_->binds_to_connection(); }
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  // Returns the keys as this namespace names them (without the prefix).
  std::vector<std::string> wait_gone(const std::vector<std::string>& keys, Millis timeout) override;
  bool waits_for_absence() const override { return base_->waits_for_absence(); }
  bool wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                      std::stop_token stop) override;
  std::optional<std::vector<std::string>> wait_gone_stoppable(const std::vector<std::string>& keys,
                                                              Millis timeout,
                                                              std::stop_token stop) override;
  bool erase(const std::string& key) override;
  int64_t num_keys() override;
  int64_t num_keys_with_prefix(const std::string& prefix) override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  Millis timeout() const override { return base_->timeout(); }
  void set_timeout(Millis timeout) override { base_->set_timeout(timeout); }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;
  // Full keys as this namespace names them (the prefix taken off).
  std::vector<std::string> local(std::vector<std::string> keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace weft::comm
