// MembershipWake: an agent parked on the membership record learns of another agent's write
// (here a graceful leave), or of a member's alive key going with nobody writing, from its
// eventfd, before it polls; nothing wakes it while the record and the keys stay as they were; a
// member who joined later is watched too; the destructor ends the parked waits at once. Agents
// as threads over one InMemoryStore (or a TCPStore where the test must see the waits parked);
// every wait is a hang guard, never a timing expectation, and the destructor's bound is the
// park it must not wait out.
#include "launch/membership_wake.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>

#include "comm/elastic/rendezvous.h"
#include "comm/store/in_memory_store.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "tests/support/eventually.h"
#include "tests/support/stop_counting_store.h"

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

// A member dies and nobody writes the record: the store drops its alive key (a bound key of
// a killed agent's connection; here erased by hand, as InMemoryStore has no connections, after
// its heartbeat stopped as a killed agent's does). The loss thread, parked in wait_gone on the
// members' alive keys, wakes the agent without any record write; the key it saw go is not
// waited on again until the record changes, so it does not wake in a loop.
TEST(MembershipWake, AMembersAliveKeyGoingWakesTheAgentWithoutARecordWrite) {
  comm::InMemoryStore store;
  // Three, so that two survivors keep a majority and may form the next epoch.
  auto three = [](const std::string& node) {
    comm::RendezvousOptions o = options(node);
    o.max_nodes = 3;
    return o;
  };
  comm::Rendezvous a(store, three("a")), b(store, three("b")), c(store, three("c"));
  {
    auto ja = std::async(std::launch::async, [&] { return a.join(); });
    auto jb = std::async(std::launch::async, [&] { return b.join(); });
    auto jc = std::async(std::launch::async, [&] { return c.join(); });
    ja.get(), jb.get(), jc.get();
  }
  // Whoever joined an epoch the others grew adopts the grown one.
  for (comm::Rendezvous* r : {&a, &b, &c})
    while (r->membership()->world() < 3) ASSERT_TRUE(r->watch(20s).has_value());
  const int64_t epoch = a.membership()->epoch;
  ASSERT_EQ(b.membership()->epoch, epoch);
  ASSERT_EQ(c.membership()->epoch, epoch);

  MembershipWake wake(store, a, 50ms);
  ASSERT_TRUE(wake.watches_losses()) << "InMemoryStore can wait for a key to go";
  EXPECT_FALSE(readable(wake.fd(), 300));
  const int64_t version = a.read_record().version;

  c.heartbeat().stop();  // c is killed: no more beats, no leave
  ASSERT_TRUE(store.erase(a.alive_key("c")));
  ASSERT_TRUE(readable(wake.fd(), 20'000)) << "no wake when a member's alive key went";
  EXPECT_EQ(wake.loss_wakes(), 1u);
  EXPECT_EQ(a.read_record().version, version) << "nobody wrote the record";
  uint64_t drained = 0;
  ASSERT_EQ(::read(wake.fd(), &drained, sizeof drained), ssize_t(sizeof drained));
  // Seen once: several parked slices pass without another wake for the same key.
  EXPECT_FALSE(readable(wake.fd(), 300));
  EXPECT_EQ(wake.loss_wakes(), 1u);

  // What woke it is there to see: a's first poll forms the epoch without c.
  std::optional<comm::Membership> next = a.poll_change();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->world(), 2);
  EXPECT_GT(next->epoch, epoch);
}

// The loss thread waits on the keys of the record it read, for as long as a minute: a record
// change (here c joining the epoch) ends that wait, and the thread waits on the new record's
// keys, so that the member who joined after the wake started wakes it when its key goes. Over
// a TCPStore, whose server tells when both waits are parked (on a and b's keys) before c comes.
TEST(MembershipWake, AMemberWhoJoinedAfterTheWakeStartedWakesItWhenItsKeyGoes) {
  comm::TCPStoreServer server(comm::TCPStoreServerOptions{});
  auto connect = [&] { return std::make_unique<comm::TCPStore>("127.0.0.1", server.port(), 20s); };
  auto sa = connect(), sb = connect(), sc = connect(), swake = connect();
  auto three = [](const std::string& node) {
    comm::RendezvousOptions o = options(node);
    o.max_nodes = 3;
    return o;
  };
  comm::Rendezvous a(*sa, three("a")), b(*sb, three("b")), c(*sc, three("c"));
  {
    auto ja = std::async(std::launch::async, [&] { return a.join(); });
    auto jb = std::async(std::launch::async, [&] { return b.join(); });
    ja.get(), jb.get();
  }
  for (comm::Rendezvous* r : {&a, &b})
    while (r->membership()->world() < 2) ASSERT_TRUE(r->watch(20s).has_value());

  MembershipWake wake(*swake, a, 50ms);
  ASSERT_TRUE(wake.watches_losses());
  ASSERT_TRUE(test::eventually([&] { return server.stats().waits_parked == 2; }))
      << "the change key's wait and the alive keys' wait_gone are not both parked: "
      << server.stats().waits_parked;
  c.join();  // writes the record (c waiting, then the epoch of three)
  while (a.membership()->world() < 3) ASSERT_TRUE(a.watch(20s).has_value());
  ASSERT_TRUE(readable(wake.fd(), 20'000)) << "no wake for the record's changes";
  EXPECT_EQ(wake.loss_wakes(), 0u);

  c.heartbeat().stop();  // c is killed: no more beats, no leave
  ASSERT_TRUE(sa->erase(a.alive_key("c")));
  EXPECT_TRUE(test::eventually([&] { return wake.loss_wakes() == 1; }))
      << "the key of a member who joined later went unseen";
}

// The destructor ends both parked waits at once: it returns long before a wait could have
// timed out (kPark). Over a TCPStore, whose server tells when both waits are parked.
TEST(MembershipWake, TheDestructorEndsBothParkedWaitsAtOnce) {
  comm::TCPStoreServer server(comm::TCPStoreServerOptions{});
  auto connect = [&] { return std::make_unique<comm::TCPStore>("127.0.0.1", server.port(), 20s); };
  auto sa = connect(), sb = connect();
  auto swake =
      std::make_unique<test::StopCountingStore<comm::TCPStore>>("127.0.0.1", server.port(), 20s);
  comm::Rendezvous a(*sa, options("a")), b(*sb, options("b"));
  {
    auto ja = std::async(std::launch::async, [&] { return a.join(); });
    auto jb = std::async(std::launch::async, [&] { return b.join(); });
    ja.get(), jb.get();
  }
  auto wake = std::make_unique<MembershipWake>(*swake, a, 50ms);
  ASSERT_TRUE(wake->watches_losses()) << "this TCPStore server can wait for a key to go";
  ASSERT_TRUE(test::eventually([&] { return server.stats().waits_parked == 2; }))
      << "the change key's wait and the alive keys' wait_gone are not both parked";

  // Waits stopped so far (a record change ends the loss thread's wait of the record before).
  const int stopped_before = swake->stopped.load();
  const auto stopping = std::chrono::steady_clock::now();
  wake.reset();
  const auto took = std::chrono::steady_clock::now() - stopping;
  std::printf("[ measure ] the wake's destructor: %.1f ms (park %lld s)\n",
              std::chrono::duration<double, std::milli>(took).count(),
              static_cast<long long>(MembershipWake::kPark.count() / 1000));
  // Both parked waits ended because the destructor stopped them, not at their park's end.
  EXPECT_EQ(swake->stopped.load() - stopped_before, 2);
  EXPECT_EQ(swake->timed_out.load(), 0);
}

}  // namespace
}  // namespace weft::launch
