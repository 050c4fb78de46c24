// launch/membership_wake.h over etcd: the agents' loss thread parks in EtcdStore::wait_gone
// on the members' alive keys, so a member whose heartbeat stopped (a frozen agent, a host
// that vanished: nobody erases its key, nobody writes the record) wakes the agent when its
// lease runs out, not at its next monitor pass; an idle agent's wake holds its two watches
// without making new ones, and its destructor ends them at once. Three rendezvous as threads
// over one real etcd member; the waits are hang guards, the lease bound (lease + 1 s) and the
// park (the destructor returns before a wait could have timed out) the only timings.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "comm/elastic/rendezvous.h"
#include "comm/store/etcd_store.h"
#include "launch/membership_wake.h"
#include "tests/comm/etcd_cluster.h"
#include "tests/comm/etcd_metrics.h"
#include "tests/support/stop_counting_store.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

// Three rendezvous as threads, joined in one epoch, over one etcd member; `swake` is the
// wake's connection of its own. Members beat every 200 ms under `heartbeat_timeout` leases.
struct ThreeAgents {
  explicit ThreeAgents(std::chrono::milliseconds heartbeat_timeout)
      : cluster(1),
        sa(store()),
        sb(store()),
        sc(store()),
        swake(std::make_unique<test::StopCountingStore<comm::EtcdStore>>(store_options())),
        a(*sa, options("a", heartbeat_timeout)),
        b(*sb, options("b", heartbeat_timeout)),
        c(*sc, options("c", heartbeat_timeout)) {}

  // Joins the three; false (and a test failure) when they do not end up in one epoch.
  bool join() {
    auto ja = std::async(std::launch::async, [&] { return a.join(); });
    auto jb = std::async(std::launch::async, [&] { return b.join(); });
    auto jc = std::async(std::launch::async, [&] { return c.join(); });
    ja.get(), jb.get(), jc.get();
    for (comm::Rendezvous* r : {&a, &b, &c})
      while (r->membership()->world() < 3)
        if (!r->watch(20s).has_value()) return false;
    return true;
  }
  double metric(const char* name) { return etcd_metric(cluster.endpoint(0), name); }

  EtcdCluster cluster;
  std::unique_ptr<comm::EtcdStore> sa, sb, sc;
  std::unique_ptr<test::StopCountingStore<comm::EtcdStore>> swake;
  comm::Rendezvous a, b, c;

 private:
  comm::EtcdStoreOptions store_options() const {
    comm::EtcdStoreOptions o;
    o.endpoints = cluster.endpoints();
    o.prefix = "/mw/";
    o.timeout = 30s;
    return o;
  }
  std::unique_ptr<comm::EtcdStore> store() const {
    return std::make_unique<comm::EtcdStore>(store_options());
  }
  static comm::RendezvousOptions options(const std::string& node,
                                         std::chrono::milliseconds heartbeat_timeout) {
    comm::RendezvousOptions o;
    o.run_id = "job";
    o.node_id = node;
    o.min_nodes = 1;
    o.max_nodes = 3;
    o.heartbeat_interval = 200ms;
    o.heartbeat_timeout = heartbeat_timeout;
    o.poll_interval = 20ms;
    o.last_call = 0s;
    o.join_timeout = 60s;
    return o;
  }
};

TEST(EtcdMembershipWake, AMembersLeaseEndingWakesTheAgentWithoutARecordWrite) {
  SKIP_WITHOUT_ETCD();
  ThreeAgents agents(1s);  // the test's members grant 1 s leases
  ASSERT_TRUE(agents.join());
  comm::Rendezvous& a = agents.a;
  comm::Rendezvous& c = agents.c;
  comm::EtcdStore* sa = agents.sa.get();
  comm::EtcdStore* swake = agents.swake.get();

  launch::MembershipWake wake(*swake, a, 200ms);
  ASSERT_TRUE(wake.watches_losses()) << "EtcdStore can wait for a key to go";
  EXPECT_FALSE(readable(wake.fd(), 1500)) << "woken while every member beats";
  const int64_t version = a.read_record().version;

  const auto stopped = Clock::now();
  c.heartbeat().stop();  // c froze: no more beats, no leave, its key left to its lease
  ASSERT_TRUE(readable(wake.fd(), 20'000)) << "no wake when a member's lease ended";
  const double ms = ms_since(stopped);
  std::printf("[ measure ] heartbeat stopped -> the agent's wake: %.0f ms (1 s lease)\n", ms);
  EXPECT_LE(ms, 2200) << "later than the lease (1 s after the last beat) plus a second";
  EXPECT_FALSE(sa->check({a.alive_key("c")}));
  EXPECT_EQ(wake.loss_wakes(), 1u);
  EXPECT_EQ(a.read_record().version, version) << "nobody wrote the record";

  std::optional<comm::Membership> next = a.poll_change();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->world(), 2);
}

// An idle job over etcd: the wake's two waits hold one watch each for as long as nothing
// changes, making no new one (with a 200 ms park each wait made one per park, about ten a
// second), and the destructor ends both at once, long before their park of a minute. Leases of
// 5 s, so that no member's key runs out while the test looks.
TEST(EtcdMembershipWake, AnIdleAgentsWakeHoldsTwoWatchesMakesNoMoreAndItsDestructorEndsThem) {
  SKIP_WITHOUT_ETCD();
  ThreeAgents agents(5s);
  ASSERT_TRUE(agents.join());
  ASSERT_GE(agents.metric(kEtcdWatchStreamsStarted), 0)
      << kEtcdWatchStreamsStarted << " is not on etcd's /metrics page";
  auto wake = std::make_unique<launch::MembershipWake>(*agents.swake, agents.a, 200ms);
  ASSERT_TRUE(eventually([&] { return agents.metric(kEtcdWatchers) == 2; }))
      << "the wake's two waits hold no watch each";
  const double made = agents.metric(kEtcdWatchStreamsStarted);
  const auto idle_from = Clock::now();
  std::this_thread::sleep_for(3s);  // the members beat; nothing else happens
  const double more = agents.metric(kEtcdWatchStreamsStarted) - made;
  std::printf("[ measure ] watches made by an idle agent's wake in %.1f s: %.0f\n",
              ms_since(idle_from) / 1000, more);
  EXPECT_EQ(more, 0) << "an idle wake makes new watches";
  EXPECT_EQ(agents.metric(kEtcdWatchers), 2);
  EXPECT_EQ(wake->wakes(), 0u);

  // Waits stopped so far (a record change ends the loss thread's wait of the record before).
  const int stopped_before = agents.swake->stopped.load();
  const auto stopping = Clock::now();
  wake.reset();
  std::printf("[ measure ] the wake's destructor: %.1f ms (park %lld s)\n", ms_since(stopping),
              static_cast<long long>(launch::MembershipWake::kPark.count() / 1000));
  // Both parked waits ended because the destructor stopped them, not at their park's end.
  EXPECT_EQ(agents.swake->stopped.load() - stopped_before, 2);
  EXPECT_EQ(agents.swake->timed_out.load(), 0);
  EXPECT_TRUE(eventually([&] { return agents.metric(kEtcdWatchers) == 0; }))
      << "the wake's watches outlived it";
}

}  // namespace
}  // namespace weft::test
