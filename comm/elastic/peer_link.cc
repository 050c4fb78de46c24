// Peer links: the listener's thread, the handshake both ways, and a link's state.
#include "comm/elastic/peer_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "base/host.h"
#include "comm/store/auth.h"

namespace weft::comm {
namespace {

constexpr char kMagic[8] = {'w', 'e', 'f', 't', 'p', 'e', 'e', 'r'};
// One context per direction: a proof the observer made can never pass as the listener's.
constexpr const char* kObserverContext = "weft-peer-check-observer-v1";
constexpr const char* kListenerContext = "weft-peer-check-listener-v1";
// A listener's handshake with one observer waits this long for each read: a stranger that
// connects and sends nothing holds the listener's thread no longer.
constexpr Millis kListenerHandshakeTimeout{1'000};

Bytes concat(const Bytes& a, const Bytes& b) {
  Bytes c = a;
  c.insert(c.end(), b.begin(), b.end());
  return c;
}

Bytes proof_or_empty(const std::string& token, const Bytes& first, const Bytes& second,
                     const char* context) {
  return token.empty() ? Bytes(auth::kProofBytes, 0) : auth::proof(token, first, second, context);
}

void set_timeouts(int fd, Millis t) {
  timeval tv{};
  tv.tv_sec = t.count() / 1000;
  tv.tv_usec = (t.count() % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool send_all(int fd, const Bytes& b) {
  size_t done = 0;
  while (done < b.size()) {
    const ssize_t n = ::send(fd, b.data() + done, b.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

bool recv_all(int fd, uint8_t* p, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(fd, p + done, size - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// The observer's reads: each waits at most `timeout` for data, and gives up at once when
// `cancel_fd` (an eventfd; -1: none) is readable, so that a dial never outlives its owner.
bool recv_all_or_cancel(int fd, uint8_t* p, size_t size, Millis timeout, int cancel_fd) {
  size_t done = 0;
  while (done < size) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {cancel_fd, POLLIN, 0}};
    const int n = ::poll(fds, cancel_fd >= 0 ? 2 : 1, int(timeout.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || (cancel_fd >= 0 && fds[1].revents)) return false;
    const ssize_t got = ::recv(fd, p + done, size - done, MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return false;
    done += size_t(got);
  }
  return true;
}

void put_u64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace

// ---- the listener ----------------------------------------------------------------------

PeerListener::PeerListener(const std::string& host, uint16_t port, std::string node_id,
                           std::string token)
    : host_(host), node_id_(std::move(node_id)), token_(std::move(token)) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    throw IoError(str("peer check: cannot listen on ", host, ": ", ::gai_strerror(rc)));
  std::string why = "no address";
  for (addrinfo* a = found; a && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0)
    throw IoError(str("peer check: cannot listen on ", host, ":", port, ": ", why));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) {
    ::close(listen_fd_);
    throw IoError(str("peer check: no eventfd: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { loop(); });
}

PeerListener::~PeerListener() {
  const uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(stop_fd_);
  ::close(listen_fd_);
}

bool PeerListener::handshake(int fd) {
  set_timeouts(fd, kListenerHandshakeTimeout);
  const Bytes nonce_l = auth::random_bytes(auth::kNonceBytes);
  if (!send_all(fd, concat(Bytes(kMagic, kMagic + 8), nonce_l))) return false;
  uint8_t in[auth::kNonceBytes + auth::kProofBytes];
  if (!recv_all(fd, in, sizeof in)) return false;
  const Bytes nonce_o(in, in + auth::kNonceBytes);
  const Bytes got(in + auth::kNonceBytes, in + sizeof in);
  if (!token_.empty() &&
      !auth::proof_matches(auth::proof(token_, nonce_l, nonce_o, kObserverContext), got))
    return false;
  Bytes reply = proof_or_empty(token_, nonce_o, nonce_l, kListenerContext);
  reply.push_back(uint8_t(node_id_.size()));
  reply.push_back(uint8_t(node_id_.size() >> 8));
  reply.insert(reply.end(), node_id_.begin(), node_id_.end());
  const ClientProcess me = this_client_process().value_or(ClientProcess{});
  for (uint64_t v : {uint64_t(me.pid), me.pid_ns_dev, me.pid_ns_ino, me.start_ticks})
    put_u64(reply, v);
  return send_all(fd, reply);
}

void PeerListener::loop() {
  std::vector<int> held;  // verified observers' connections
  for (;;) {
    std::vector<pollfd> fds = {{stop_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (int fd : held) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    if (fds[0].revents) break;
    std::vector<int> kept;
    for (size_t i = 2; i < fds.size(); ++i) {
      uint8_t sink[64];
      // An observer sends nothing after the handshake: readable means it closed (or sent
      // garbage, which is dropped the same way).
      if (fds[i].revents) {
        const ssize_t n = ::recv(fds[i].fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          ::close(fds[i].fd);
          continue;
        }
      }
      kept.push_back(fds[i].fd);
    }
    held = std::move(kept);
    if (fds[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        if (handshake(fd)) {
          set_timeouts(fd, Millis(0));
          held.push_back(fd);
        } else {
          refused_.fetch_add(1);
          ::close(fd);
        }
      }
    }
    connections_ = int(held.size());
  }
  for (int fd : held) ::close(fd);
  connections_ = 0;
}

// ---- the observer's side -----------------------------------------------------------------

PeerLink& PeerLink::operator=(PeerLink&& o) noexcept {
  if (this != &o) {
    close();
    fd = o.fd;
    pidfd = o.pidfd;
    process = o.process;
    o.fd = o.pidfd = -1;
  }
  return *this;
}

void PeerLink::close() {
  if (fd >= 0) ::close(fd);
  if (pidfd >= 0) ::close(pidfd);
  fd = pidfd = -1;
}

bool PeerLink::broken() const {
  if (fd < 0) return true;
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  uint8_t b;
  const ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

bool PeerLink::process_gone() const {
  if (pidfd < 0) return false;
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

PeerLink dial_peer(const std::string& endpoint, const std::string& node_id,
                   const std::string& token, Millis timeout, int cancel_fd) {
  std::pair<std::string, uint16_t> hp;
  try {
    hp = split_endpoint(endpoint);
  } catch (const std::invalid_argument& e) {
    throw IoError(str("peer check: ", e.what()));
  }
  const std::string& host = hp.first;
  const std::string service = std::to_string(hp.second);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    throw IoError(str("peer check: cannot resolve ", host, ": ", ::gai_strerror(rc)));
  PeerLink link;
  std::string why = "no address";
  for (addrinfo* a = found; a && !link.open(); a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      pollfd p[2] = {{fd, POLLOUT, 0}, {cancel_fd, POLLIN, 0}};
      int err = ETIMEDOUT;
      socklen_t len = sizeof err;
      if (::poll(p, cancel_fd >= 0 ? 2 : 1, int(timeout.count())) > 0) {
        if (p[0].revents)
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        else
          err = ECANCELED;
      }
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      link.fd = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (!link.open()) throw IoError(str("peer check: cannot connect to ", endpoint, ": ", why));
  set_timeouts(link.fd, timeout);
  auto fail = [&](const std::string& what) {
    throw IoError(str("peer check: node ", node_id, " at ", endpoint, ": ", what));
  };
  uint8_t hello[8 + auth::kNonceBytes];
  auto recv = [&](uint8_t* p, size_t size) {
    return recv_all_or_cancel(link.fd, p, size, timeout, cancel_fd);
  };
  if (!recv(hello, sizeof hello) || std::memcmp(hello, kMagic, 8) != 0)
    fail("not a weft peer check listener (no greeting)");
  const Bytes nonce_l(hello + 8, hello + sizeof hello);
  const Bytes nonce_o = auth::random_bytes(auth::kNonceBytes);
  if (!send_all(link.fd,
                concat(nonce_o, proof_or_empty(token, nonce_l, nonce_o, kObserverContext))))
    fail("it closed the handshake (a wrong job token?)");
  uint8_t proof[auth::kProofBytes], len[2];
  if (!recv(proof, sizeof proof) || !recv(len, sizeof len))
    fail("it refused the handshake (a wrong job token: WEFT_JOB_TOKEN)");
  if (!token.empty() && !auth::proof_matches(auth::proof(token, nonce_o, nonce_l, kListenerContext),
                                             Bytes(proof, proof + sizeof proof)))
    fail("it cannot prove the job token: not this job's agent");
  std::string id(size_t(len[0]) | size_t(len[1]) << 8, '\0');
  uint8_t process[32];
  if (!recv(reinterpret_cast<uint8_t*>(id.data()), id.size()) || !recv(process, sizeof process))
    fail("a cut handshake");
  if (id != node_id) fail(str("it is node ", id, " now (the node's port was taken by another)"));
  link.process = {int64_t(get_u64(process)), get_u64(process + 8), get_u64(process + 16),
                  get_u64(process + 24)};
  link.pidfd = link.process.pid > 0 ? open_client_process(link.process) : -1;
  set_timeouts(link.fd, Millis(0));
  return link;
}

}  // namespace weft::comm
