// InMemoryStore: the Store contract inside one process, for unit tests that need a store
// but not a network (a fake, not a mock: it really blocks, times out and expires keys).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <stop_token>

#include "comm/store/kv_table.h"
#include "comm/store/store.h"

namespace weft::comm {

// Shared by threads of one process; behaves like a TCPStore whose server is local.
class InMemoryStore : public Store {
 public:
  explicit InMemoryStore(Millis timeout = Millis(30'000), size_t max_value_bytes = size_t(64)
                                                                                   << 20);

  void set(const std::string& key, const Bytes& value, std::optional<Millis> ttl = {}) override;
  // No connection to bind keys to: SetOptions::bind throws NotSupported (store.h).
  using Store::set;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  std::vector<std::string> wait_gone(const std::vector<std::string>& keys, Millis timeout) override;
  bool waits_for_absence() const override { return true; }
  // A stop wakes the parked wait at once.
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
  Millis timeout() const override;
  void set_timeout(Millis timeout) override;

 private:
  // Waits on changed_ until every key exists (true) or `stop` is requested (false); throws
  // TimeoutError after `timeout`.
  bool wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   Millis timeout, const std::stop_token& stop = {});
  // wait_gone()'s wait on changed_; nullopt when `stop` is requested.
  std::optional<std::vector<std::string>> wait_gone_locked(std::unique_lock<std::mutex>& lock,
                                                           const std::vector<std::string>& keys,
                                                           Millis timeout,
                                                           const std::stop_token& stop);
  // Wakes the waiters when `stop` is requested, for as long as it lives (take it before mu_).
  std::stop_callback<std::function<void()>> wake_at(const std::stop_token& stop);

  mutable std::mutex mu_;
  std::condition_variable changed_;
  KvTable table_;
  Millis timeout_;
};

}  // namespace weft::comm
