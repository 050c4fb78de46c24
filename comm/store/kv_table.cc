// KvTable: key-value semantics shared by the TCP server and the in-memory fake.
#include "comm/store/kv_table.h"

#include <charconv>
#include <string_view>

#include "base/error.h"
#include "comm/store/store_util.h"

namespace weft::comm {

void KvTable::check_size(const std::string& key, size_t n) const {
  if (n > max_value_bytes_)
    throw CommError("store: value for '" + key + "' has " + std::to_string(n) +
                    " bytes, more than the store's max_value_bytes " +
                    std::to_string(max_value_bytes_));
}

void KvTable::clear_deadline(const std::string& key, Entry& e) {
  if (e.deadline) deadlines_.erase({*e.deadline, key});
  e.deadline.reset();
}

void KvTable::unbind(const std::string& key, Entry& e) {
  if (e.owner == kNoOwner) return;
  auto it = owned_.find(e.owner);
  if (it != owned_.end()) {
    it->second.erase(key);
    if (it->second.empty()) owned_.erase(it);
  }
  e.owner = kNoOwner;
}

void KvTable::set_deadline(const std::string& key, Entry& e, Clock::time_point at) {
  clear_deadline(key, e);
  e.deadline = at;
  deadlines_.insert({at, key});
}

void KvTable::remove(std::map<std::string, Entry>::iterator it) {
  clear_deadline(it->first, it->second);
  unbind(it->first, it->second);
  bytes_ -= it->first.size() + it->second.value.size();
  if (log_removals_) removed_.push_back(it->first);
  entries_.erase(it);
}

void KvTable::set(const std::string& key, Bytes value, std::optional<Millis> ttl, Owner owner) {
  check_size(key, value.size());
  expire();
  auto [it, fresh] = entries_.try_emplace(key);
  Entry& e = it->second;
  bytes_ -= fresh ? 0 : key.size() + e.value.size();
  clear_deadline(key, e);
  unbind(key, e);
  e.value = std::move(value);
  bytes_ += key.size() + e.value.size();
  // At least 1 ms: a TTL of 0 would make set() a no-op that still wakes waiters.
  if (ttl) set_deadline(key, e, Clock::now() + std::max(clamp_timeout(*ttl), Millis(1)));
  if (owner != kNoOwner) {
    e.owner = owner;
    owned_[owner].insert(key);
  }
}

size_t KvTable::release(Owner owner, Millis grace) {
  return release(owner, grace, nullptr, nullptr);
}

size_t KvTable::release(Owner owner, Millis grace, std::vector<Released>* released,
                        Clock::time_point* deadline) {
  auto it = owned_.find(owner);
  if (it == owned_.end()) return 0;
  std::set<std::string> keys = std::move(it->second);
  owned_.erase(it);
  const auto at = Clock::now() + clamp_timeout(grace);
  if (deadline) *deadline = at;
  if (released) released->clear();
  for (const std::string& key : keys) {
    auto e = entries_.find(key);
    if (e == entries_.end()) continue;
    e->second.owner = kNoOwner;
    if (grace <= Millis(0)) {
      remove(e);
    } else {
      // A key with a TTL that ends sooner keeps it (a heartbeat's alive key: 2 s against a
      // 30 s grace); drop_released must then know that deadline, not the grace's.
      if (!e->second.deadline || *e->second.deadline > at) set_deadline(key, e->second, at);
      if (released) released->push_back({key, *e->second.deadline});
    }
  }
  return keys.size();
}

size_t KvTable::drop_released(const std::vector<Released>& keys) {
  expire();
  size_t n = 0;
  for (const auto& [key, at] : keys) {
    auto e = entries_.find(key);
    if (e == entries_.end() || e->second.owner != kNoOwner || e->second.deadline != at) continue;
    remove(e);
    ++n;
  }
  return n;
}

size_t KvTable::bound_to(Owner owner) const {
  auto it = owned_.find(owner);
  return it == owned_.end() ? 0 : it->second.size();
}

void KvTable::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  for (size_t i = 0; i < keys.size(); ++i) check_size(keys[i], values[i].size());
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i], std::nullopt, kNoOwner);
}

const Bytes* KvTable::find(const std::string& key) {
  expire();
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second.value;
}

bool KvTable::contains_all(const std::vector<std::string>& keys) {
  expire();
  for (const auto& k : keys)
    if (!entries_.count(k)) return false;
  return true;
}

int64_t KvTable::add(const std::string& key, int64_t delta) {
  expire();
  auto it = entries_.find(key);
  int64_t current = 0;
  if (it != entries_.end()) {
    std::string_view text(reinterpret_cast<const char*>(it->second.value.data()),
                          it->second.value.size());
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), current);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty())
      throw CommError("store: add on '" + key + "' whose value is not a decimal integer");
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result))
    throw CommError("store: add on '" + key + "' overflows int64");
  std::string text = std::to_string(result);
  auto [at, fresh] = entries_.try_emplace(key);
  bytes_ -= fresh ? 0 : key.size() + at->second.value.size();
  at->second.value.assign(text.begin(), text.end());
  bytes_ += key.size() + text.size();
  return result;
}

Bytes KvTable::compare_set(const std::string& key, const Bytes& expected, Bytes desired,
                           bool* wrote) {
  check_size(key, desired.size());
  expire();
  *wrote = false;
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (!expected.empty()) return {};
    *wrote = true;
    entries_[key].value = desired;
    bytes_ += key.size() + desired.size();
    return desired;
  }
  if (it->second.value == expected) {
    *wrote = true;
    bytes_ = bytes_ - it->second.value.size() + desired.size();
    it->second.value = std::move(desired);
  }
  return it->second.value;
}

bool KvTable::erase(const std::string& key) {
  expire();
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  remove(it);
  return true;
}

void KvTable::append(const std::string& key, const Bytes& value) {
  expire();
  auto it = entries_.find(key);
  size_t have = it == entries_.end() ? 0 : it->second.value.size();
  check_size(key, have + value.size());
  Bytes& v = entries_[key].value;
  v.insert(v.end(), value.begin(), value.end());
  bytes_ += (it == entries_.end() ? key.size() : 0) + value.size();
}

int64_t KvTable::count(const std::string& prefix) {
  expire();
  if (prefix.empty()) return static_cast<int64_t>(entries_.size());
  int64_t n = 0;
  for (auto it = entries_.lower_bound(prefix);
       it != entries_.end() && it->first.starts_with(prefix); ++it)
    ++n;
  return n;
}

std::optional<KvTable::Clock::time_point> KvTable::expire() {
  auto now = Clock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    auto it = entries_.find(deadlines_.begin()->second);
    if (it == entries_.end() || it->second.deadline != deadlines_.begin()->first) {
      deadlines_.erase(deadlines_.begin());
      continue;
    }
    remove(it);  // erases the deadline too
  }
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

}  // namespace weft::comm
