// In-memory snapshots, the transport between the nodes' snapshot agents (issue 15): TCP,
// every connection authenticated both ways with the job token before anything else is read,
// then length-prefixed JSON messages and raw runs of bytes, each operation bounded by a
// deadline. Replica push (launch/snapshot_replicas.h) runs on it; so can EC's fragments.
//
// The handshake reuses the TCP store's challenge-response (comm/store/auth.h: HMAC-SHA256
// of fresh nonces, the token never sent) with contexts of its own, in both directions: the
// listener proves the token to the connecting agent as well, so that a snapshot is never
// sent to a process that does not hold the job's token.
//
//   listener -> peer   {"weft":"snapshot-peer","version":1,"job":J,"nonce":N1,"token":bool}
//   peer -> listener   {"job":J,"node":i,"nonce":N2,"proof":hex HMAC(token, N1 N2 kPeerClient)}
//   listener -> peer   {"ok":true,"proof":hex HMAC(token, N2 N1 kPeerServer)}
//                      or {"ok":false,"error":why}, then the listener closes
//
// A frame is a 4-byte little-endian length, then that many bytes (a JSON object, at most
// kPeerMaxMessageBytes). Byte runs (payloads) follow a message that announces their length.
// Without a token (a job on loopback only) the listener accepts peers on its own machine
// only, unless it was made insecure (weft run's --rdzv-conf insecure).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"

namespace weft::checkpoint {

inline constexpr size_t kPeerMaxMessageBytes = size_t(16) << 20;
inline constexpr const char* kPeerClientContext = "weft-snapshot-peer-v1/client";
inline constexpr const char* kPeerServerContext = "weft-snapshot-peer-v1/server";

// Who may talk to whom: the job's id and token (empty: none; see above).
struct PeerAuth {
  std::string job;
  std::string token;
  bool insecure = false;  // without a token: accept peers from other machines too
};

// A served connection whose peer sent no request within the timeout: it is closed quietly.
class IdlePeer : public IoError {
 public:
  using IoError::IoError;
};

// One authenticated connection. A call fails once `timeout` passes with no bytes moved on
// the connection (received, written, or drained from its send buffer toward the peer), so
// a long payload on a slow link is never cut while it moves and a hung peer is; a timeout,
// a closed connection or a malformed frame is an IoError naming the peer, after which the
// connection is closed and every later call throws. One thread at a time, except abort().
class PeerChannel {
 public:
  // Connects to `endpoint` ("host:port"), proves the token as node `node`, and checks the
  // listener's proof. IoError when it cannot connect in time, the listener refuses (a wrong
  // token, another job), or the listener cannot prove the token itself.
  static std::unique_ptr<PeerChannel> connect(const std::string& endpoint, const PeerAuth& auth,
                                              int node, std::chrono::milliseconds timeout);
  ~PeerChannel();
  PeerChannel(const PeerChannel&) = delete;
  PeerChannel& operator=(const PeerChannel&) = delete;

  void send(const nlohmann::json& message);
  nlohmann::json receive();
  // A served connection's next request: receive(), except that a frame that has not started
  // when the timeout passes ends the connection as idle (IdlePeer), not as a hung peer. A peer
  // between snapshots may say nothing for longer than the timeout; it connects anew when it
  // has something to send.
  nlohmann::json receive_request();
  void send_bytes(const void* data, size_t n);
  void receive_bytes(void* data, size_t n);
  // The other side: "host:port" (and its node, as it said in the handshake, on a listener).
  const std::string& peer() const { return peer_; }
  int peer_node() const { return peer_node_; }
  bool open() const;
  // Any thread: makes the call in progress (and every later one) fail at once.
  void abort();
  // The "no bytes moved" timeout of later calls, for a caller that allows its connect and
  // handshake longer than its transfers.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // Caps the kernel's receive buffer of this connection at about `bytes` (SO_RCVBUF, which
  // also stops its autotuning). A writer sees its peer read only while bytes wait in its own
  // send queue: those in the peer's receive buffer (up to tcp_rmem's 32 MiB on loopback)
  // are beyond it, so a reader slower than the buffer over the timeout looks hung to it.
  // Tests of a slow reader bound that window with it; returns false when the system refuses.
  bool cap_receive_buffer(int bytes);

 private:
  friend class PeerListener;
  struct Io;
  explicit PeerChannel(std::chrono::milliseconds timeout);
  void handshake_as_listener(const PeerAuth& auth);
  void fail(const std::string& what);
  nlohmann::json receive_body(const uint8_t frame[4]);
  std::unique_ptr<Io> io_;
  std::chrono::milliseconds timeout_;
  std::string peer_;
  int peer_node_ = -1;
  std::atomic<bool> aborted_{false};
};

// Accepts peers on host:port (port 0: any free one) on a thread of its own and serves each
// on a thread of its own: the handshake (a peer that fails it is told why, logged through
// `log` and closed: nothing it sends past the handshake is read), then `serve(channel)`
// until it returns or throws (an IoError there just ends the connection, logged when it is
// not the peer going away). Throws IoError when it cannot listen.
class PeerListener {
 public:
  using Serve = std::function<void(PeerChannel&)>;
  using Log = std::function<void(const std::string&)>;
  PeerListener(const std::string& host, uint16_t port, PeerAuth auth, Serve serve, Log log,
               std::chrono::milliseconds timeout);
  ~PeerListener();  // stop()
  PeerListener(const PeerListener&) = delete;
  PeerListener& operator=(const PeerListener&) = delete;

  // "host:port" as bound (the port chosen when 0 was asked for).
  std::string endpoint() const;
  // Stops accepting, aborts every connection and joins every thread; idempotent. After it
  // returns, `serve` runs nowhere.
  void stop();
  int64_t refused() const { return refused_.load(); }

 private:
  struct Impl;
  struct Session {
    std::unique_ptr<PeerChannel> channel;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void accept_next();
  void run_session(Session& s);
  void reap(bool all);
  std::unique_ptr<Impl> impl_;
  PeerAuth auth_;
  Serve serve_;
  Log log_;
  std::chrono::milliseconds timeout_;
  std::string host_;
  uint16_t port_ = 0;
  std::mutex mu_;  // sessions_, stopped_
  std::vector<std::unique_ptr<Session>> sessions_;
  bool stopped_ = false;
  std::atomic<int64_t> refused_{0};
  std::thread thread_;
};

}  // namespace weft::checkpoint
