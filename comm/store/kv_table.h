// The store's data and the semantics of its operations (TTL, add, compare_set), without
// waiting or locking: TCPStoreServer drives one from its single thread, InMemoryStore
// under a mutex, so the two cannot drift apart.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/store/store.h"

namespace weft::comm {

// Not thread-safe; the owner serialises calls. Every method first drops keys whose TTL has
// passed, so an expired key is never observed even if no sweep ran yet.
class KvTable {
 public:
  using Clock = std::chrono::steady_clock;

  // Values longer than max_value_bytes are refused with CommError (set, append, ...).
  explicit KvTable(size_t max_value_bytes) : max_value_bytes_(max_value_bytes) {}

  // A connection's id, for keys bound to it (SetOptions::bind); kNoOwner: not bound.
  using Owner = uint64_t;
  static constexpr Owner kNoOwner = 0;

  // A ttl (re)arms the key's expiry at now + ttl; no ttl makes the key permanent. `owner`
  // binds the key to that connection, kNoOwner unbinds it (whoever bound it before).
  void set(const std::string& key, Bytes value, std::optional<Millis> ttl, Owner owner = kNoOwner);
  // The connection `owner` closed: its bound keys are unbound and expire `grace` from now
  // (or at their TTL if that comes first); a grace of 0 erases them now. A set() before
  // then keeps the key (a reconnected client rebinding it). Returns how many it held.
  size_t release(Owner owner, Millis grace);
  // What release() left of an unbound key: its name and the deadline it then had (the
  // grace's end, or the key's own TTL where that came sooner).
  struct Released {
    std::string key;
    Clock::time_point deadline;
  };
  // release() with a grace, also handing back the keys it unbound (into `keys`) and the
  // grace's end (`*at`), for drop_released().
  size_t release(Owner owner, Millis grace, std::vector<Released>* keys, Clock::time_point* at);
  // Ends the grace of keys that release() unbound, now: each of `keys` that is still as it
  // left it (unbound, with the deadline it left; a set() since, a rebind by a reconnected
  // client or a new TTL, keeps it) is erased. Returns how many went.
  size_t drop_released(const std::vector<Released>& keys);
  // Keys bound to `owner` now.
  size_t bound_to(Owner owner) const;
  // Sets every key (no TTL) or, when any value is too long, none (CommError).
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values);
  // The value, or nullptr when absent. The pointer is valid until the next call.
  const Bytes* find(const std::string& key);
  bool contains_all(const std::vector<std::string>& keys);
  // The value is decimal text (as in c10d), absent counts as 0. Throws CommError when the
  // current value is not an integer or the sum overflows. Keeps the key's TTL.
  int64_t add(const std::string& key, int64_t delta);
  // Writes `desired` when the current value equals `expected` (an empty `expected` also
  // matches an absent key). Returns the value after the call, empty when absent; unlike
  // c10d, an absent key with a non-empty `expected` returns empty, so a CAS loop that
  // retries with the returned value converges. Keeps the key's TTL. Sets *wrote.
  Bytes compare_set(const std::string& key, const Bytes& expected, Bytes desired, bool* wrote);
  bool erase(const std::string& key);
  // Creates the key when absent; keeps its TTL otherwise.
  void append(const std::string& key, const Bytes& value);
  // Keys that start with `prefix` ("" counts every key).
  int64_t count(const std::string& prefix);
  // Drops expired keys now; returns the earliest deadline still pending, if any.
  std::optional<Clock::time_point> expire();
  // With the log on, every key that goes (erase, its TTL, a bound key's release or drop) is
  // noted, for a server that wakes wait_gone() callers; take_removed() hands the notes over
  // and clears them. Off by default, so an owner that never takes them does not grow it.
  void log_removals(bool on) { log_removals_ = on; }
  std::vector<std::string> take_removed() { return std::exchange(removed_, {}); }
  size_t max_value_bytes() const { return max_value_bytes_; }
  // Sum of the key and value sizes held now (expired keys count until the next call).
  size_t bytes() const { return bytes_; }

 private:
  struct Entry {
    Bytes value;
    std::optional<Clock::time_point> deadline;
    Owner owner = kNoOwner;
  };
  void check_size(const std::string& key, size_t n) const;
  void clear_deadline(const std::string& key, Entry& e);
  void unbind(const std::string& key, Entry& e);
  void set_deadline(const std::string& key, Entry& e, Clock::time_point at);
  // Removes the entry, its deadline and binding, and notes it when logging.
  void remove(std::map<std::string, Entry>::iterator it);

  size_t max_value_bytes_;
  size_t bytes_ = 0;
  std::map<std::string, Entry> entries_;  // ordered, so prefix counts are a range scan
  std::set<std::pair<Clock::time_point, std::string>> deadlines_;
  std::unordered_map<Owner, std::set<std::string>> owned_;  // bound keys by connection
  bool log_removals_ = false;
  std::vector<std::string> removed_;
};

}  // namespace weft::comm
