// Heartbeat: a thread that keeps one TTL key alive in the store (rdzv/<run>/alive/<node>),
// so that other agents can tell this node is alive by the key existing. Where the store can
// (SetOptions::bind), the key is also bound to this process's store connection, so that it
// goes within the store's grace of the process dying, not ttl after its last beat.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "comm/store/store.h"

namespace weft::comm {

// Sets `key` with ttl = `ttl` every `interval` (interval < ttl, see rendezvous_options.h).
// The key outlives a beat by ttl, so a node is declared lost at most ttl after its last
// successful beat (a crash, SIGKILL, or a partition from the store).
//
// With a `witness_key` and a store whose binds_to_connection() is true, each beat sets
// `witness_key` (ttl only) and then `key` (ttl, bound to the connection). When the process
// dies and its kernel closes its socket, the store drops `key` after its grace while the
// witness stays until its ttl; when the process is cut off without closing anything (power
// loss, a pulled cable, SIGSTOP) both run out by ttl, the witness first (it was set first on
// the same connection, so its deadline is never later). So whoever finds `key` gone can
// tell why: the witness is still there exactly when the connection closed. Without a
// witness, or over a store that cannot bind (EtcdStore: leases end by TTL only), it is the
// plain TTL key above; bound() says which. There the agents' peer check (peer_check.h) erases
// the key of a node whose process died, as the store does with a bound key.
//
// Threads: start/stop/erase and the accessors may be called from any thread, not
// concurrently with the destructor. The beating thread never throws: a failed set (store
// unreachable, refused) is recorded (failure(), failures()) and retried at the next
// interval; a later success clears failure(). `store` must outlive this object and be
// thread-safe (every Store is).
class Heartbeat {
 public:
  Heartbeat(Store& store, std::string key, Millis interval, Millis ttl,
            std::string witness_key = {});
  // stop(). Never throws.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Beats once on the calling thread (throws that beat's CommError, so a caller learns at
  // once that the store refuses it), then starts the thread. No-op when running.
  void start();
  // Stops and joins the thread; the key stays until its TTL runs out (or, when bound, its
  // store connection closes), as after a crash. Idempotent; never throws.
  void stop();
  // stop(), then erases the key (and its witness) so that others see the node gone at once
  // (a graceful leave). Best effort: returns false when the store could not be reached.
  bool stop_and_erase();

  bool running() const { return running_.load(); }
  const std::string& key() const { return key_; }
  // The key is bound to the store connection (a witness was given and the store binds).
  bool bound() const { return bound_; }
  const std::string& witness_key() const { return witness_key_; }
  uint64_t beats() const { return beats_.load(); }        // successful sets so far
  uint64_t failures() const { return failures_.load(); }  // failed sets so far
  // The error of the most recent beat when it failed; nullopt when it succeeded.
  std::optional<std::string> failure() const;

 private:
  void beat_once();  // throws
  void loop();

  Store& store_;
  const std::string key_, witness_key_;
  const Millis interval_, ttl_;
  const bool bound_;
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> beats_{0}, failures_{0};
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;               // guarded by mu_
  std::optional<std::string> failure_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace weft::comm
