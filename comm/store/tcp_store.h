// TCPStore: the Store client of TCPStoreServer. One connection per client carries every
// thread's requests at once; a background thread matches replies to callers by request id.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/store/store.h"

namespace weft::comm {

// How long the destructor waits for the server to acknowledge its goodbye.
inline constexpr Millis kGoodbyeWait{1'000};

struct TCPStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  // get()/multi_get() wait this long for their keys; every other request waits this long
  // for its reply; the constructor retries connecting for this long.
  Millis timeout = kDefaultStoreTimeout;
  // The job token, proven to the server at connect (never sent). Empty: none; a store that
  // has a token then refuses this client. Workers pass auth::token_from_env().
  std::string token;
};

// Thread-safe (see Store). The constructor connects, retrying while the server is not up
// yet (a rank may start before the store), then pings it; it throws TimeoutError when no
// connection succeeds within options.timeout and CommError when the host does not resolve,
// the peer is not a store, or the store refused the token (missing or wrong: the message
// names WEFT_JOB_TOKEN). A broken connection (server gone) fails every call in flight
// and every later call with CommError; the client does not reconnect. Blocking operations
// are timed by the server, so a timed-out wait costs no extra round trip; the client gives
// up by itself only if the server's answer is overdue (a hung or partitioned server).
// Keys set with SetOptions::bind belong to this client's connection (store.h): the
// destructor says goodbye first (one round trip, at most kGoodbyeWait), so they go at once;
// a process killed without it leaves them to the server's bound_key_grace, or, where the
// server runs on this machine and takes kOwner (protocol.h), to the moment the server sees
// this process exit (sent once, before the first bound key).
// Destroy it only when no call is in flight.
class TCPStore : public Store {
 public:
  explicit TCPStore(TCPStoreOptions options);
  TCPStore(const std::string& host, uint16_t port, Millis timeout = kDefaultStoreTimeout);
  ~TCPStore() override;
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  void set(const std::string& key, const Bytes& value, std::optional<Millis> ttl = {}) override;
  // With `bind`: NotSupported when the server is older than bound keys (its hello said so).
  void set(const std::string& key, const Bytes& value, const SetOptions& options) override;
  bool binds_to_connection() const override;
  // wait_gone(): against a server whose handshake offers it (kHelloWaitsGone).
  std::vector<std::string> wait_gone(const std::vector<std::string>& keys, Millis timeout) override;
  bool waits_for_absence() const override;
  // A stop ends the call at once; the server's wait stays until its keys come or its timeout
  // passes (a waiter in its memory, a reply this client drops).
  bool wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                      std::stop_token stop) override;
  std::optional<std::vector<std::string>> wait_gone_stoppable(const std::vector<std::string>& keys,
                                                              Millis timeout,
                                                              std::stop_token stop) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool erase(const std::string& key) override;
  int64_t num_keys() override;
  int64_t num_keys_with_prefix(const std::string& prefix) override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  Millis timeout() const override { return Millis(timeout_ms_.load()); }
  void set_timeout(Millis timeout) override { timeout_ms_ = timeout.count(); }

  // Round trip with no effect; throws like any call when the server is unreachable.
  void ping();
  const std::string& host() const { return options_.host; }
  uint16_t port() const { return options_.port; }

 private:
  class Connection;
  TCPStoreOptions options_;
  std::atomic<int64_t> timeout_ms_;
  std::unique_ptr<Connection> conn_;
  std::atomic<bool> owner_told_{false};  // kOwner sent on this connection
};

}  // namespace weft::comm
