// Heartbeat: a thread that keeps one TTL key alive in the store (rdzv/<run>/alive/<node>),
// so that other agents can tell this node is alive by the key existing.
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
// Threads: start/stop/erase and the accessors may be called from any thread, not
// concurrently with the destructor. The beating thread never throws: a failed set (store
// unreachable, refused) is recorded (failure(), failures()) and retried at the next
// interval; a later success clears failure(). `store` must outlive this object and be
// thread-safe (every Store is).
class Heartbeat {
 public:
  Heartbeat(Store& store, std::string key, Millis interval, Millis ttl);
  // stop(). Never throws.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Beats once on the calling thread (throws that beat's CommError, so a caller learns at
  // once that the store refuses it), then starts the thread. No-op when running.
  void start();
  // Stops and joins the thread; the key stays until its TTL runs out, as after a crash.
  // Idempotent; never throws.
  void stop();
  // stop(), then erases the key so that others see the node gone at once (a graceful
  // leave). Best effort: returns false when the store could not be reached.
  bool stop_and_erase();

  bool running() const { return running_.load(); }
  const std::string& key() const { return key_; }
  uint64_t beats() const { return beats_.load(); }        // successful sets so far
  uint64_t failures() const { return failures_.load(); }  // failed sets so far
  // The error of the most recent beat when it failed; nullopt when it succeeded.
  std::optional<std::string> failure() const;

 private:
  void beat_once();  // throws
  void loop();

  Store& store_;
  const std::string key_;
  const Millis interval_, ttl_;
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> beats_{0}, failures_{0};
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;               // guarded by mu_
  std::optional<std::string> failure_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace weft::comm
