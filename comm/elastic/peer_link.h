// Peer links: one TCP connection from an observing agent to a watched agent, held open and
// idle, whose close tells the observer that the watched agent's kernel closed its socket (its
// process died: a crash, SIGKILL, an OOM kill). The peer check (peer_check.h) uses them where
// the store cannot bind a key to a connection (etcd).
//
// The handshake proves both ends hold the job token (HMAC of both nonces, one context per
// direction, comm/store/auth.h), so that neither a stranger's listener nor a stranger's
// connection takes part; then the listener says which node and which process it is
// (ClientProcess), so that an observer on the same machine and pid namespace can tell a dead
// peer from a live one whose connection broke. Without a token (--rdzv-conf insecure=1) the
// proofs are empty and not checked.
//
//   listener -> observer   "weftpeer" (8), nonce L (32)
//   observer -> listener   nonce O (32), proof(token, L || O, observer context) (32)
//   listener -> observer   proof(token, O || L, listener context) (32), node id (u16 length,
//                          bytes), pid, pid ns dev, pid ns ino, start ticks (4 x u64)
// After that nothing is sent; the listener reads only to see the observer go.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "comm/store/client_process.h"
#include "comm/store/store.h"

namespace weft::comm {

// The watched side: listens on `host`:`port` (0: a free port) and holds every verified
// observer's connection until the observer closes it or this object is destroyed. Its
// connections close with its process, which is what the observers wait for.
class PeerListener {
 public:
  // Throws IoError naming the address when it cannot listen.
  PeerListener(const std::string& host, uint16_t port, std::string node_id, std::string token);
  // Closes the listening socket and every connection. Never throws.
  ~PeerListener();
  PeerListener(const PeerListener&) = delete;
  PeerListener& operator=(const PeerListener&) = delete;

  uint16_t port() const { return port_; }
  // "host:port", what the node publishes for its observers.
  std::string endpoint() const { return host_ + ":" + std::to_string(port_); }
  // Observers whose handshake passed and whose connection is open now.
  int connections() const { return connections_.load(); }
  // Handshakes refused so far (a wrong token, a malformed or slow handshake).
  uint64_t refused() const { return refused_.load(); }

 private:
  void loop();
  bool handshake(int fd);  // true: keep the connection
  const std::string host_, node_id_, token_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd that ends the loop
  std::atomic<int> connections_{0};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

// One verified connection to a watched node. fd() becomes readable when the watched end
// closes (recv returns 0 or an error: the link is broken) or, harmlessly, never otherwise.
struct PeerLink {
  int fd = -1;
  ClientProcess process;  // what the listener said it is
  int pidfd = -1;         // open_client_process(process): -1 unless it is visible from here
  PeerLink() = default;
  PeerLink(PeerLink&& o) noexcept { *this = std::move(o); }
  PeerLink& operator=(PeerLink&& o) noexcept;
  ~PeerLink() { close(); }
  void close();
  bool open() const { return fd >= 0; }
  // The connection was closed by the other end (checks without blocking).
  bool broken() const;
  // The watched process has exited, as its pidfd says; false when there is no pidfd.
  bool process_gone() const;
};

// Connects to `endpoint` ("host:port"), runs the handshake as the observer, and checks that
// the listener is node `node_id`. Each step waits at most `timeout`, and none past the moment
// `cancel_fd` (an eventfd, -1: none) becomes readable. Throws IoError saying which step
// failed (no connection, a wrong proof, another node, cancelled).
PeerLink dial_peer(const std::string& endpoint, const std::string& node_id,
                   const std::string& token, Millis timeout, int cancel_fd = -1);

}  // namespace weft::comm
