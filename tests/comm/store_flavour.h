// The two stores whose waits the store tests run on each: a TCPStore against a server of its
// own, and an InMemoryStore; where the store tells (the TCP server), how many waits are parked.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "comm/store/in_memory_store.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "tests/support/eventually.h"

namespace weft::test {

// One store under test, and a second client for the other side where the store has clients.
struct Flavour {
  std::unique_ptr<comm::TCPStoreServer> server;
  std::shared_ptr<comm::Store> waiter;
  std::shared_ptr<comm::Store> other;
  // Waits parked at the server now (TCP); -1 where the store cannot tell.
  int64_t parked() const { return server ? int64_t(server->stats().waits_parked) : -1; }
};

inline Flavour tcp_flavour() {
  using namespace std::chrono_literals;
  Flavour f;
  f.server = std::make_unique<comm::TCPStoreServer>(comm::TCPStoreServerOptions{});
  f.waiter = std::make_shared<comm::TCPStore>("127.0.0.1", f.server->port(), 10s);
  f.other = std::make_shared<comm::TCPStore>("127.0.0.1", f.server->port(), 10s);
  return f;
}

inline Flavour memory_flavour() {
  using namespace std::chrono_literals;
  Flavour f;
  f.waiter = std::make_shared<comm::InMemoryStore>(10s);
  f.other = f.waiter;
  return f;
}

// Waits, on another thread, until `n` waits are parked (where the store tells).
inline void until_parked(const Flavour& f, int64_t n) {
  if (f.parked() < 0) return;
  ASSERT_TRUE(eventually([&] { return f.parked() == n; })) << "the wait never parked";
}

}  // namespace weft::test
