// InMemoryStore: KvTable under a mutex, with a condition variable for blocking reads.
#include "comm/store/in_memory_store.h"

#include "base/error.h"
#include "comm/store/store_util.h"

namespace weft::comm {

InMemoryStore::InMemoryStore(Millis timeout, size_t max_value_bytes)
    : table_(max_value_bytes), timeout_(timeout) {}

bool InMemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                                const std::vector<std::string>& keys, Millis timeout,
                                const std::stop_token& stop) {
  auto deadline = KvTable::Clock::now() + clamp_timeout(timeout);
  while (!table_.contains_all(keys)) {
    if (stop.stop_requested()) return false;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
        !table_.contains_all(keys))
      throw TimeoutError(timeout_message(keys, timeout));
  }
  return true;
}

std::stop_callback<std::function<void()>> InMemoryStore::wake_at(const std::stop_token& stop) {
  // Through the mutex: a waiter is either before its look at `stop` or parked on changed_.
  return std::stop_callback<std::function<void()>>(stop, [this] {
    std::lock_guard lock(mu_);
    changed_.notify_all();
  });
}

void InMemoryStore::set(const std::string& key, const Bytes& value, std::optional<Millis> ttl) {
  {
    std::lock_guard lock(mu_);
    table_.set(key, value, ttl);
  }
  changed_.notify_all();
}

Bytes InMemoryStore::get(const std::string& key) {
  std::unique_lock lock(mu_);
  wait_locked(lock, {key}, timeout_);
  return *table_.find(key);
}

int64_t InMemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard lock(mu_);
    v = table_.add(key, delta);
  }
  changed_.notify_all();
  return v;
}

Bytes InMemoryStore::compare_set(const std::string& key, const Bytes& expected,
                                 const Bytes& desired) {
  bool wrote = false;
  Bytes v;
  {
    std::lock_guard lock(mu_);
    v = table_.compare_set(key, expected, desired, &wrote);
  }
  if (wrote) changed_.notify_all();
  return v;
}

void InMemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock lock(mu_);
  wait_locked(lock, keys, timeout);
}

bool InMemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  return table_.contains_all(keys);
}

bool InMemoryStore::erase(const std::string& key) {
  bool existed;
  {
    std::lock_guard lock(mu_);
    existed = table_.erase(key);
  }
  if (existed) changed_.notify_all();  // wait_gone
  return existed;
}

std::vector<std::string> InMemoryStore::wait_gone(const std::vector<std::string>& keys,
                                                  Millis timeout) {
  std::unique_lock lock(mu_);
  return *wait_gone_locked(lock, keys, timeout, {});
}

std::optional<std::vector<std::string>> InMemoryStore::wait_gone_locked(
    std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys, Millis timeout,
    const std::stop_token& stop) {
  const auto deadline = KvTable::Clock::now() + clamp_timeout(timeout);
  for (;;) {
    std::vector<std::string> absent;
    for (const auto& k : keys)
      if (!table_.find(k)) absent.push_back(k);
    if (!absent.empty() || keys.empty()) return absent;
    if (stop.stop_requested()) return std::nullopt;
    // A TTL ends without a call to wake anyone: wake at the next one too.
    const std::optional<KvTable::Clock::time_point> next = table_.expire();
    const auto until = next ? std::min(deadline, *next) : deadline;
    if (changed_.wait_until(lock, until) == std::cv_status::timeout &&
        KvTable::Clock::now() >= deadline && table_.contains_all(keys))
      throw TimeoutError(gone_timeout_message(keys, timeout));
  }
}

bool InMemoryStore::wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                                   std::stop_token stop) {
  const auto wake = wake_at(stop);  // outlives the lock: it takes the mutex
  std::unique_lock lock(mu_);
  return wait_locked(lock, keys, timeout, stop);
}

std::optional<std::vector<std::string>> InMemoryStore::wait_gone_stoppable(
    const std::vector<std::string>& keys, Millis timeout, std::stop_token stop) {
  const auto wake = wake_at(stop);
  std::unique_lock lock(mu_);
  return wait_gone_locked(lock, keys, timeout, stop);
}

int64_t InMemoryStore::num_keys() { return num_keys_with_prefix(""); }

int64_t InMemoryStore::num_keys_with_prefix(const std::string& prefix) {
  std::lock_guard lock(mu_);
  return table_.count(prefix);
}

void InMemoryStore::append(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mu_);
    table_.append(key, value);
  }
  changed_.notify_all();
}

std::vector<Bytes> InMemoryStore::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock lock(mu_);
  wait_locked(lock, keys, timeout_);
  std::vector<Bytes> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(*table_.find(k));
  return out;
}

void InMemoryStore::multi_set(const std::vector<std::string>& keys,
                              const std::vector<Bytes>& values) {
  check_multi_set(keys, values);
  {
    std::lock_guard lock(mu_);
    table_.multi_set(keys, values);
  }
  changed_.notify_all();
}

Millis InMemoryStore::timeout() const {
  std::lock_guard lock(mu_);
  return timeout_;
}

void InMemoryStore::set_timeout(Millis timeout) {
  std::lock_guard lock(mu_);
  timeout_ = timeout;
}

}  // namespace weft::comm
