// PrefixStore: key rewriting in front of another Store.
#include "comm/store/prefix_store.h"

#include "base/error.h"

namespace weft::comm {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (prefix_.empty()) throw CommError("PrefixStore: empty prefix");
  if (!base_) throw CommError("PrefixStore: no base store");
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

std::vector<std::string> PrefixStore::local(std::vector<std::string> keys) const {
  for (auto& k : keys) k.erase(0, prefix_.size() + 1);
  return keys;
}

void PrefixStore::set(const std::string& key, const Bytes& value, std::optional<Millis> ttl) {
  base_->set(full(key), value, ttl);
}
void PrefixStore::set(const std::string& key, const Bytes& value, const SetOptions& options) {
  base_->set(full(key), value, options);
}
Bytes PrefixStore::get(const std::string& key) { return base_->get(full(key)); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(full(key), delta);
}
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(full(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  base_->wait(full(keys), timeout);
}

std::vector<std::string> PrefixStore::wait_gone(const std::vector<std::string>& keys,
                                                Millis timeout) {
  return local(base_->wait_gone(full(keys), timeout));
}
bool PrefixStore::wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                                 std::stop_token stop) {
  return base_->wait_stoppable(full(keys), timeout, std::move(stop));
}

std::optional<std::vector<std::string>> PrefixStore::wait_gone_stoppable(
    const std::vector<std::string>& keys, Millis timeout, std::stop_token stop) {
  auto gone = base_->wait_gone_stoppable(full(keys), timeout, std::move(stop));
  if (!gone) return std::nullopt;
  return local(std::move(*gone));
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(full(keys)); }
bool PrefixStore::erase(const std::string& key) { return base_->erase(full(key)); }
int64_t PrefixStore::num_keys() { return base_->num_keys_with_prefix(prefix_ + "/"); }
int64_t PrefixStore::num_keys_with_prefix(const std::string& prefix) {
  return base_->num_keys_with_prefix(full(prefix));
}
void PrefixStore::append(const std::string& key, const Bytes& value) {
  base_->append(full(key), value);
}
std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  return base_->multi_get(full(keys));
}
void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  base_->multi_set(full(keys), values);
}

}  // namespace weft::comm
