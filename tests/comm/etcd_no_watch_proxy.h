// NoWatchProxy: an HTTP proxy on loopback in front of one etcd member that answers every
// POST /v3/watch with a fixed error status (404, 501: an etcd, or a gateway in front of one,
// without the v3 watch) and forwards every other request to the member, so that EtcdStore's
// poll fallback (etcd_store.h) can be tested against a real etcd.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace weft::test {

class NoWatchProxy {
 public:
  // Listens on a free loopback port at once; `status`: what /v3/watch gets (404, 501...).
  NoWatchProxy(const std::string& member, unsigned status);
  // Closes every connection and joins every thread. Never throws.
  ~NoWatchProxy();
  NoWatchProxy(const NoWatchProxy&) = delete;
  NoWatchProxy& operator=(const NoWatchProxy&) = delete;

  std::string endpoint() const;  // "127.0.0.1:PORT"
  // Watch requests refused, and other requests forwarded, so far.
  int64_t watches_refused() const;
  int64_t forwarded() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::test
