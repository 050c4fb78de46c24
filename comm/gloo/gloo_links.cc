// GlooLinks: matches each Gloo pair to its socket by the pair's own address and the peer's
// published one, so teardown can use shutdown(2) on it.
#include "comm/gloo/gloo_links.h"

#include <dirent.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "base/check.h"

namespace weft::comm {

namespace {

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

// Copies the address proper of `from` into a zeroed `to` (sin_zero and the tail of the
// sockaddr_storage stay zero), so the bytes published for an endpoint are deterministic.
void copy_endpoint(const sockaddr_storage& from, sockaddr_storage& to) {
  std::memset(&to, 0, sizeof to);
  if (from.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(from);
    auto& out = reinterpret_cast<sockaddr_in&>(to);
    out.sin_family = AF_INET;
    out.sin_port = in.sin_port;
    out.sin_addr = in.sin_addr;
  } else if (from.ss_family == AF_INET6) {
    std::memcpy(&to, &from, sizeof(sockaddr_in6));
  }
}

// True when fd is (still) the TCP connection local -> remote.
bool is_connection(int fd, const sockaddr_storage& local, const sockaddr_storage& remote) {
  sockaddr_storage s{}, p{};
  socklen_t sl = sizeof(s), pl = sizeof(p);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&s), &sl) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&p), &pl) != 0) return false;
  return same_endpoint(s, local) && same_endpoint(p, remote);
}

}  // namespace

GlooLinks::GlooLinks(gloo::Context& context, Store& store, const std::string& prefix)
    : context_(context),
      rank_(context.rank),
      local_(size_t(context.size)),
      remote_(size_t(context.size)),
      remote_names_(size_t(context.size)),
      fds_(size_t(context.size), -1) {
  const size_t n = size_t(context.size);
  for (size_t r = 0; r < n; ++r) {
    std::memset(&local_[r], 0, sizeof(sockaddr_storage));
    std::memset(&remote_[r], 0, sizeof(sockaddr_storage));
    if (int(r) == rank_) continue;
    // After connecting, a TCP pair's address is the local end of its socket.
    const auto* a =
        dynamic_cast<const gloo::transport::tcp::Address*>(&context.getPair(int(r))->address());
    // Only the family's own bytes: Gloo leaves the rest of its sockaddr_storage
    // uninitialised, and local_ is published to the store as it is.
    if (a) copy_endpoint(a->getSockaddr(), local_[r]);
  }
  Bytes mine(n * sizeof(sockaddr_storage));
  std::memcpy(mine.data(), local_.data(), mine.size());
  store.set(prefix + "/links/" + std::to_string(rank_), mine);
  for (size_t r = 0; r < n; ++r) {
    if (int(r) == rank_) continue;
    Bytes theirs = store.get(prefix + "/links/" + std::to_string(r));
    WEFT_ENSURE(theirs.size() == mine.size(), CommError, "gloo: rank ", r, " published ",
                theirs.size(), " bytes of links, expected ", mine.size());
    std::memcpy(&remote_[r], theirs.data() + size_t(rank_) * sizeof(sockaddr_storage),
                sizeof(sockaddr_storage));
    if (remote_[r].ss_family == AF_INET || remote_[r].ss_family == AF_INET6)
      remote_names_[r] = gloo::transport::tcp::Address(remote_[r]).str();
  }
  // Find the sockets: the only ones in the process with exactly these two ends.
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const int fd = std::atoi(e->d_name);
      for (size_t r = 0; r < n; ++r)
        if (int(r) != rank_ && fds_[r] < 0 && remote_names_[r].size() &&
            is_connection(fd, local_[r], remote_[r]))
          fds_[r] = fd;
    }
    closedir(dir);
  }
}

int GlooLinks::peer_in_message(const std::string& message) const {
  for (size_t r = 0; r < remote_names_.size(); ++r) {
    const std::string& name = remote_names_[r];
    if (name.empty()) continue;
    // "[127.0.0.1]:4242" must not match "[127.0.0.1]:42420".
    for (size_t at = message.find(name); at != std::string::npos; at = message.find(name, at + 1)) {
      const size_t end = at + name.size();
      if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end])))
        return int(r);
    }
  }
  return -1;
}

int GlooLinks::lost_peer() const {
  int lost = -1;
  for (size_t r = 0; r < fds_.size(); ++r) {
    if (int(r) == rank_ || fds_[r] < 0) continue;
    bool gone = !is_connection(fds_[r], local_[r], remote_[r]);  // Gloo closed it
    if (!gone) {
      pollfd p{fds_[r], POLLRDHUP, 0};
      gone = ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
    }
    if (!gone) continue;
    if (lost >= 0) return -1;  // several: the message cannot be pinned on one
    lost = int(r);
  }
  return lost;
}

void GlooLinks::shut_down() noexcept {
  for (size_t r = 0; r < fds_.size(); ++r) {
    if (int(r) == rank_) continue;
    try {
      // Checked right before use: Gloo closes a failed pair's socket, and its number may
      // since belong to another connection of this process.
      if (fds_[r] >= 0 && is_connection(fds_[r], local_[r], remote_[r])) {
        ::shutdown(fds_[r], SHUT_RDWR);
      } else if (auto& pair = context_.getPair(int(r))) {
        pair->close();
      }
    } catch (...) {
      // A pair that cannot be closed fails by its timeout.
    }
  }
}

}  // namespace weft::comm
