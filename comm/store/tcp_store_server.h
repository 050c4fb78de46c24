// TCPStoreServer: the store's server on Boost.Asio, one thread serving every connection (and
// one only accepting them).
// Run alone with `weft store --port P`, inside `weft run`'s agent, or in tests on port 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/error.h"
#include "comm/store/store.h"

namespace weft::comm {

struct TCPStoreServerOptions {
  // Address to listen on, and only there: "127.0.0.1" for this machine only, "0.0.0.0" for
  // every interface (which needs a token or `insecure`, below).
  std::string host = "127.0.0.1";
  // 0 asks the kernel for a free port; port() tells which one it got.
  uint16_t port = 0;
  // The job token. Non-empty: every connection must prove it holds the same token (HMAC
  // challenge-response, comm/store/auth.h) before any request; one that does not is told
  // so and closed. Empty: no proof is asked, and then only loopback clients are served and
  // the constructor refuses a non-loopback `host` (ConfigError naming WEFT_JOB_TOKEN),
  // unless `insecure`.
  std::string token;
  // Serve clients from anywhere without a token. For trusted networks and tests only.
  bool insecure = false;
  // Bound on what one connection may make the server hold: the frame being read, replies
  // queued because the client does not read them, and its parked waits. A client that goes
  // over it is disconnected, with a WEFT_WARN naming the peer and the reason.
  size_t max_client_bytes = size_t(256) << 20;
  // Longest value a key may hold; set/append/... beyond it fail with CommError at the
  // client, the connection stays open.
  size_t max_value_bytes = size_t(64) << 20;
  // Longest frame: checked on the 4-byte header, before anything is allocated; a longer one
  // closes the connection (malformed). 0: max_value_bytes + 1 MiB (room for keys).
  size_t max_frame_bytes = 0;
  // Bound on everything the server holds at once: every connection's buffers plus the keys
  // and values stored. A connection that would pass it is closed; a write that would is
  // refused with CommError (the connection stays).
  size_t max_total_bytes = size_t(1) << 30;
  // A frame (or the handshake) must arrive whole within this once its first byte did; a
  // client that sends half a frame and stalls is disconnected.
  Millis read_timeout{30'000};
  // A connection with nothing in flight (no partial frame, no parked wait, no unsent reply)
  // for this long is closed. 0: never (clients hold their connection for a whole job).
  Millis idle_timeout{0};
  // How long the keys bound to a connection (SetOptions::bind) outlive it when it closes
  // without the client's goodbye; a set() of the key in that time (the client reconnected
  // at once) keeps it. 250 ms: a reconnect on a live network (TCPStore's connect, handshake
  // and first set) takes a few ms, so a quarter second covers a client that reconnects and
  // rebinds at once with room for a slow scheduler, yet it is small against the second or so
  // that a lost node may cost the others (detect, agree, resume), and 20x below the 5 s
  // heartbeat_timeout it replaces when a node's processes die. 0: drop them at once.
  // A client on this machine that said which process it is (TCPStore does, protocol.h's
  // kOwner) is watched through a pidfd: once that process has exited its keys go at once,
  // grace or not (a dead process never reconnects); only a live one's keys wait the grace.
  Millis bound_key_grace{250};
};

// Counters for tests, `weft store`'s shutdown line and `weft bench store`. Monotonic except
// connections_open, waits_parked and bytes_held.
struct TCPStoreServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t connections_open_peak = 0;  // the most connections_open has been
  uint64_t dropped_malformed = 0;   // closed for a frame that broke the protocol
  uint64_t dropped_over_limit = 0;  // closed for exceeding max_client_bytes / max_total_bytes
  uint64_t dropped_timeout = 0;     // closed by read_timeout or idle_timeout
  uint64_t refused_auth = 0;        // closed for a missing or wrong token (or not loopback)
  uint64_t requests = 0;            // well-formed requests handled
  uint64_t waits_parked = 0;        // get/wait/multi_get blocked on missing keys right now
  uint64_t bytes_held = 0;          // connection buffers + stored keys and values, now
  uint64_t bytes_held_peak = 0;     // the most bytes_held has been
  uint64_t goodbyes = 0;            // connections that said goodbye (a clean close)
  uint64_t bound_keys_released = 0;  // bound keys whose connection closed (or said goodbye)
  // Of those, the keys dropped before their grace ended because the client's process had
  // exited (kOwner, a client on this machine): it will never reconnect to rebind them.
  uint64_t bound_keys_dropped_at_exit = 0;
};

// The address is taken (EADDRINUSE): another process serves that port. `weft run`'s agents
// race to host the store of a multi-node job; the losers connect to the winner.
class AddressInUseError : public CommError {
 public:
  using CommError::CommError;
};

// The constructor binds (to options.host only), listens on a close-on-exec socket (workers
// spawned later do not inherit it) and starts serving on an internal thread, with a second
// one that only accepts connections and hands them over; it throws
// CommError when the address cannot be bound (AddressInUseError when it is taken),
// ConfigError for a non-loopback host without a token (see TCPStoreServerOptions::token).
// Thread-safe: port(), stats() and stop() may be called from any thread. The server never throws or aborts because of what a client sends
// or does (vanishing mid-request, garbage, floods): the damage stays with that connection.
// Waits are parked server-side with their timeout, so a client blocked in get() costs one
// timer, not a thread. Data lives in memory only and is lost when the server stops.
// Keys bound to a connection (SetOptions::bind) go when it closes: after bound_key_grace if
// the connection just closed or broke, at once if the client said goodbye first.
class TCPStoreServer {
 public:
  explicit TCPStoreServer(TCPStoreServerOptions options = {});
  // stop(), then releases everything. Never throws.
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  uint16_t port() const;
  const std::string& host() const;
  TCPStoreServerStats stats() const;
  // Closes the listener and every connection (clients see CommError) and joins the thread.
  // Idempotent; must not be called from inside the server's own thread.
  void stop();

 private:
  class Impl;
  friend class Session;  // a connection, defined next to Impl in the .cc
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::comm
