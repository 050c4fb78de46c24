// Store: a small key-value byte store with timeouts, the rendezvous medium for
// everything distributed (membership, Gloo/NCCL bootstrap, heartbeats). Modelled on
// PyTorch's c10d Store; the operation set is TCPStore's.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

namespace weft::comm {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

// The default Store::timeout() of the network stores (TCPStore, EtcdStore): long enough for
// a slow rendezvous, short enough that a lost peer fails a job in minutes.
inline constexpr Millis kDefaultStoreTimeout{60'000};
// How often Store's own wait_stoppable() and wait_gone_stoppable(), for a store that cannot
// end a wait from another thread, look at the stop token: the wait runs in slices this long.
inline constexpr Millis kStopSlice{100};

// How set() keeps a key (the overload that takes options).
struct SetOptions {
  // As set()'s ttl: the key disappears `ttl` after this set; none: no expiry of its own.
  std::optional<Millis> ttl;
  // An ephemeral key (ZooKeeper's ephemeral nodes, an etcd lease tied to a session): the key
  // belongs to this client's connection to the store. When that connection closes without
  // the client's goodbye (its process was killed, crashed, its host's kernel tore its
  // sockets down) the store drops the key after a short grace (the server's
  // bound_key_grace, 250 ms by default), unless a set() rebinds it first (a client that
  // reconnects at once); a TCPStore client on the server's machine is watched instead, and
  // its keys go as soon as its process has exited (it can never reconnect). A clean close (the
  // client's destructor says goodbye) drops its bound keys at once. Only a closed connection
  // counts: a host that vanishes without closing anything (power loss) keeps the connection open on
  // the server, so give a bound key a ttl too when its absence must be noticed then. A later set()
  // without `bind` unbinds the key; add, append and compare_set keep the binding, as they keep the
  // TTL. Stores without connections (binds_to_connection() false) refuse it: NotSupported.
  bool bind = false;
};

// Contract (every implementation: TCPStore, InMemoryStore, PrefixStore, EtcdStore; the
// last keeps TTLs at etcd's lease granularity, whole seconds, see etcd_store.h):
// - Methods are thread-safe; a client may be shared by threads, calls may overlap, and a
//   call blocked in get/wait does not hold up other threads' calls.
// - Blocking calls (get, multi_get, wait) block until the keys exist or the timeout passes,
//   then throw weft::TimeoutError naming the keys. A store that cannot be reached, or whose
//   connection broke, throws CommError; so does an operation the store refuses (a value
//   over its size limit, add on a non-integer), with the reason in the message.
// - Values are opaque bytes; keys are UTF-8 strings. An empty value is a value: the key
//   exists.
// - A key with a TTL disappears `ttl` after the set() that gave it (heartbeats: set again
//   to extend); set() without a ttl makes it permanent; add, append and compare_set keep
//   whatever expiry the key has. An expired key is absent for every operation.
// - Writes (set, add, compare_set that writes, append, multi_set) wake blocked readers;
//   removals (erase, a TTL's end, a bound key's drop) wake wait_gone() callers.
// - A key set with SetOptions::bind goes with this client's connection (see SetOptions).
class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value, std::optional<Millis> ttl = {}) = 0;
  // set() with options. Without `bind` it is set(key, value, options.ttl). With `bind`, a
  // store that cannot bind (binds_to_connection() false) throws NotSupported naming itself,
  // never a plain key in silence: the caller that relies on it must know.
  virtual void set(const std::string& key, const Bytes& value, const SetOptions& options);
  // Whether set() with SetOptions::bind works on this client: TCPStore against a server that
  // offers it (said in the handshake; an older server does not); false for the stores
  // without a connection of their own (InMemoryStore) and for EtcdStore, whose leases end
  // by TTL only (etcd_store.h). Never blocks.
  virtual bool binds_to_connection() const { return false; }
  // Blocks until `key` exists (at most timeout()), then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (absent = 0), returns the result.
  // The value is kept as decimal text, so get() of a counter reads e.g. "3".
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` when its current value equals `expected` (an empty `expected`
  // matches an absent key). Returns the value after the call: `desired` when it wrote, the
  // current value when it did not, empty when the key is absent.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // Blocks until every key exists or `timeout` passes (TimeoutError).
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // True when every key exists now (never blocks).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // The opposite of wait(): blocks until at least one of `keys` is absent, then returns
  // those absent then, in the order given; throws TimeoutError when all of them still exist
  // after `timeout`. A key goes by erase(), by its TTL or when the connection it is bound to
  // closes (SetOptions::bind): the waiter learns of a dead client's bound key when the store
  // drops it, without polling (ZooKeeper's exists-watch, an etcd watch's DELETE). A store
  // that cannot (waits_for_absence() false) throws NotSupported.
  virtual std::vector<std::string> wait_gone(const std::vector<std::string>& keys, Millis timeout);
  // Whether wait_gone() works on this client: TCPStore against a server that offers it (said
  // in the handshake), InMemoryStore, EtcdStore (an etcd watch's DELETE events). Never blocks.
  virtual bool waits_for_absence() const { return false; }
  // wait() that another thread can end, so that a caller may park for minutes and still
  // stop at once: true when every key exists; false when `stop` is requested
  // (std::stop_source::request_stop(), a std::jthread's destructor), before the call or while
  // it waits; TimeoutError and CommError as wait(). TCPStore, InMemoryStore, EtcdStore and a
  // PrefixStore over them end the parked wait at once (EtcdStore finishes a read of the keys
  // already sent first; TCPStore drops the server's reply, which its server still sends when
  // the keys come or the wait's timeout passes). Store's own waits in slices of kStopSlice and
  // looks at `stop` between them.
  virtual bool wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                              std::stop_token stop);
  // wait_gone() that another thread can end, as wait_stoppable(): the keys absent, or nullopt
  // when `stop` is requested. NotSupported as wait_gone().
  virtual std::optional<std::vector<std::string>> wait_gone_stoppable(
      const std::vector<std::string>& keys, Millis timeout, std::stop_token stop);
  // Removes `key`; returns whether it existed.
  virtual bool erase(const std::string& key) = 0;
  // Every key in the store (a PrefixStore counts only its own namespace).
  virtual int64_t num_keys() = 0;
  // Keys that start with `prefix`, "" counting all. PrefixStore::num_keys() uses it.
  virtual int64_t num_keys_with_prefix(const std::string& prefix) = 0;
  // Appends bytes to the value at `key` (creating it).
  virtual void append(const std::string& key, const Bytes& value) = 0;
  // Blocks until every key exists (at most timeout()), then returns their values in order.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys) = 0;
  // Sets each key to its value as one atomic step; keys.size() must equal values.size().
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<Bytes>& values) = 0;

  // Timeout used by get() and by wait() callers that pass none.
  virtual Millis timeout() const = 0;
  virtual void set_timeout(Millis timeout) = 0;

  // Convenience for string values.
  void set_string(const std::string& key, const std::string& v) {
    set(key, Bytes(v.begin(), v.end()));
  }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }
};

inline Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

}  // namespace weft::comm
