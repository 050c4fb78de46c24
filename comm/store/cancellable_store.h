// A store whose blocking calls give up early when the caller's reason to wait is gone: a
// worker building the communicator of an epoch that a newer one has already replaced (some
// of its ranks will never come) must not wait out the whole store timeout. get(), wait()
// and wait_gone() wait in short slices and ask `cancelled` between them; everything else
// forwards.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/store/store.h"

namespace weft::comm {

class CancellableStore : public Store {
 public:
  // `cancelled` returns a reason to stop waiting ("" = keep waiting); it runs on the
  // calling thread. A cancelled get()/wait() throws CommError with that reason.
  CancellableStore(std::shared_ptr<Store> base, std::function<std::string()> cancelled,
                   Millis slice = Millis(100));

  void set(const std::string& key, const Bytes& value, std::optional<Millis> ttl = {}) override {
    base_->set(key, value, ttl);
  }
  void set(const std::string& key, const Bytes& value, const SetOptions& options) override {
    base_->set(key, value, options);
  }
  bool binds_to_connection() const override { return base_->binds_to_connection(); }
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(key, delta); }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return base_->compare_set(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override { return base_->check(keys); }
  std::vector<std::string> wait_gone(const std::vector<std::string>& keys, Millis timeout) override;
  bool waits_for_absence() const override { return base_->waits_for_absence(); }
  bool erase(const std::string& key) override { return base_->erase(key); }
  int64_t num_keys() override { return base_->num_keys(); }
  int64_t num_keys_with_prefix(const std::string& prefix) override {
    return base_->num_keys_with_prefix(prefix);
  }
  void append(const std::string& key, const Bytes& value) override { base_->append(key, value); }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    base_->multi_set(keys, values);
  }
  Millis timeout() const override { return base_->timeout(); }
  void set_timeout(Millis timeout) override { base_->set_timeout(timeout); }

 private:
  std::shared_ptr<Store> base_;
  std::function<std::string()> cancelled_;
  Millis slice_;
};

}  // namespace weft::comm
