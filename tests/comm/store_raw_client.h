// A raw TCP client for store tests that must speak (or break) the wire protocol directly:
// malformed frames, half-sent requests, clients that never read their replies.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

#include "comm/store/auth.h"
#include "comm/store/protocol.h"

namespace weft::test {

// Blocking socket to 127.0.0.1:port (or ipv4:port) that, unless told otherwise, first passes
// the store's handshake (comm/store/protocol.h) with `token` ("" = none). Every wait is bounded
// (kGuard) so a broken server fails the test instead of hanging it; the bound is a hang guard,
// not a timing check.
class RawClient {
 public:
  static constexpr int kGuardMs = 20'000;

  enum class Handshake { kDo, kSkip };
  explicit RawClient(uint16_t port, Handshake hs = Handshake::kDo, const std::string& token = "")
      : RawClient("127.0.0.1", port, hs, token) {}
  RawClient(const std::string& ipv4, uint16_t port, Handshake hs = Handshake::kDo,
            const std::string& token = "") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("socket failed");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (::inet_pton(AF_INET, ipv4.c_str(), &a.sin_addr) != 1) {
      ::close(fd_);
      throw std::runtime_error("not an IPv4 address: " + ipv4);
    }
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      throw std::runtime_error("connect failed");
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (hs == Handshake::kDo && !handshake(token))
      throw std::runtime_error("store handshake refused: " + refusal_);
  }

  // Reads the hello, answers it with the proof for `token` (none when empty), reads the
  // verdict. True when admitted; otherwise refusal() says why.
  bool handshake(const std::string& token) {
    auto hello = recv_frame();
    if (!hello) return refused("no hello");
    comm::wire::Reader r(hello->data(), hello->size());
    r.u8();
    r.u8();
    nonce_ = r.bytes();
    comm::wire::Writer w;
    w.u8(comm::wire::kHandshakeVersion)
        .bytes(token.empty() ? comm::Bytes() : comm::auth::proof(token, nonce_));
    if (!send(w.finish())) return refused("closed before the proof");
    auto verdict = recv_frame();
    if (!verdict || verdict->empty()) return refused("closed before the verdict");
    if ((*verdict)[0] == 0) return true;
    comm::wire::Reader v(verdict->data() + 1, verdict->size() - 1);
    return refused(v.str());
  }
  const std::string& refusal() const { return refusal_; }
  const comm::Bytes& nonce() const { return nonce_; }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Half-close: the server sees EOF after what was sent; replies can still be read.
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }

  // Sends everything; false if the server already closed the connection.
  bool send(const comm::Bytes& b) {
    size_t off = 0;
    while (off < b.size()) {
      ssize_t n = ::send(fd_, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads exactly n bytes; false on EOF, reset or the guard (then guard_hit() is true).
  bool recv_exact(uint8_t* p, size_t n) {
    size_t off = 0;
    while (off < n) {
      pollfd pf{fd_, POLLIN, 0};
      if (::poll(&pf, 1, kGuardMs) <= 0) {
        guard_hit_ = true;
        return false;
      }
      ssize_t r = ::recv(fd_, p + off, n - off, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      off += static_cast<size_t>(r);
    }
    return true;
  }

  // One reply frame's body (id, status, payload), or nullopt when the connection ended.
  std::optional<comm::Bytes> recv_frame() {
    uint8_t len[4];
    if (!recv_exact(len, 4)) return std::nullopt;
    comm::Bytes body(comm::wire::decode_length(len));
    if (!recv_exact(body.data(), body.size())) return std::nullopt;
    return body;
  }

  // True once the server has closed the connection: reads until EOF/reset, appending what
  // came to *got when given (else discarding it).
  bool closed_by_peer(comm::Bytes* got = nullptr) {
    uint8_t buf[4096];
    for (;;) {
      pollfd pf{fd_, POLLIN, 0};
      if (::poll(&pf, 1, kGuardMs) <= 0) {
        guard_hit_ = true;
        return false;
      }
      ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return true;
      if (got) got->insert(got->end(), buf, buf + r);
    }
  }

  // A read waited kGuardMs for nothing: the server neither answered nor closed.
  bool guard_hit() const { return guard_hit_; }

 private:
  bool refused(const std::string& why) {
    refusal_ = why;
    return false;
  }
  int fd_ = -1;
  bool guard_hit_ = false;
  std::string refusal_;
  comm::Bytes nonce_;
};

// Request frames, built as the client does.
inline comm::wire::Writer request(uint64_t id, comm::wire::Op op) {
  comm::wire::Writer w;
  w.u64(id).u8(static_cast<uint8_t>(op));
  return w;
}

}  // namespace weft::test
