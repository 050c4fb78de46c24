// MembershipWake: an agent parked on the membership record learns of another agent's write
// (here a graceful leave) from its eventfd, before it polls; nothing wakes it while the
// record stays as it was. Two agents as threads over one InMemoryStore; every wait is a hang
// guard, never a timing expectation.
#include "launch/membership_wake.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "comm/elastic/rendezvous.h"
#include "comm/store/in_memory_store.h"

namespace weft::launch {
namespace {

using namespace std::chrono_literals;

comm::RendezvousOptions options(const std::string& node) {
  comm::RendezvousOptions o;
  o.run_id = "job";
  o.node_id = node;
  o.min_nodes = 1;
  o.max_nodes = 2;
  o.heartbeat_interval = 200ms;
  o.heartbeat_timeout = 60s;  // no loss by TTL while the test runs
  o.poll_interval = 20ms;
  o.last_call = 0s;
  o.join_timeout = 120s;
  return o;
}

// Whether `fd` becomes readable within `ms` (a hang guard when it must).
bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

TEST(MembershipWake, AnotherAgentsLeaveWakesTheAgentBeforeItPolls) {
  comm::InMemoryStore store;
  comm::Rendezvous a(store, options("a")), b(store, options("b"));
  auto ja = std::async(std::launch::async, [&] { return a.join(); });
  auto jb = std::async(std::launch::async, [&] { return b.join(); });
  comm::Membership ma = ja.get();
  comm::Membership mb = jb.get();
  // Both in one epoch: the later one may have grown the first's epoch, whichever of the two
  // formed it (a watch adopts the grown one).
  for (auto [r, m] : {std::pair{&a, &ma}, std::pair{&b, &mb}}) {
    if (m->world() >= 2) continue;
    std::optional<comm::Membership> grown = r->watch(20s);
    ASSERT_TRUE(grown.has_value());
    *m = *grown;
  }
  ASSERT_EQ(ma.world(), 2);
  ASSERT_EQ(mb.world(), 2);
  ASSERT_EQ(a.membership()->epoch, b.membership()->epoch);

  MembershipWake wake(store, a, 50ms);
  // The record does not change: several parked slices pass without a wake.
  EXPECT_FALSE(readable(wake.fd(), 300));
  EXPECT_EQ(wake.wakes(), 0u);

  b.leave();  // one write: `left`
  ASSERT_TRUE(readable(wake.fd(), 20'000)) << "no wake after another agent's write";
  EXPECT_GE(wake.wakes(), 1u);
  // What woke it is there to see: a's first poll since forms the epoch without b.
  std::optional<comm::Membership> next = a.poll_change();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->world(), 1);
  EXPECT_GT(next->epoch, ma.epoch);
}

}  // namespace
}  // namespace weft::launch
