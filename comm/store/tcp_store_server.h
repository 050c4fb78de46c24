// TCPStoreServer: the store's server on Boost.Asio, one thread serving every connection.
// Run alone with `weft store --port P`, inside `weft run`'s agent, or in tests on port 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace weft::comm {

struct TCPStoreServerOptions {
  // Address to listen on: "127.0.0.1" for this machine only, "0.0.0.0" for every interface.
  std::string host = "127.0.0.1";
  // 0 asks the kernel for a free port; port() tells which one it got.
  uint16_t port = 0;
  // Bound on what one connection may make the server hold: the frame being read, replies
  // queued because the client does not read them, and its parked waits. A frame longer than
  // this is malformed; a client that goes over it is disconnected. Either way only that
  // connection is closed, with a WEFT_WARN naming the peer and the reason.
  size_t max_client_bytes = size_t(256) << 20;
  // Longest value a key may hold; set/append/... beyond it fail with CommError at the
  // client, the connection stays open.
  size_t max_value_bytes = size_t(64) << 20;
};

// Counters for tests and `weft store`'s shutdown line. Monotonic except connections_open.
struct TCPStoreServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t dropped_malformed = 0;   // closed for a frame that broke the protocol
  uint64_t dropped_over_limit = 0;  // closed for exceeding max_client_bytes
  uint64_t requests = 0;            // well-formed requests handled
  uint64_t waits_parked = 0;        // get/wait/multi_get blocked on missing keys right now
};

// The constructor binds, listens and starts serving on an internal thread; it throws
// CommError when the address cannot be bound. Thread-safe: port(), stats() and stop() may be
// called from any thread. The server never throws or aborts because of what a client sends
// or does (vanishing mid-request, garbage, floods): the damage stays with that connection.
// Waits are parked server-side with their timeout, so a client blocked in get() costs one
// timer, not a thread. Data lives in memory only and is lost when the server stops.
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
