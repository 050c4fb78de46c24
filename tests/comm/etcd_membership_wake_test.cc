// launch/membership_wake.h over etcd: the agents' loss thread parks in EtcdStore::wait_gone
// on the members' alive keys, so a member whose heartbeat stopped (a frozen agent, a host
// that vanished: nobody erases its key, nobody writes the record) wakes the agent when its
// lease runs out, not at its next monitor pass. Three rendezvous as threads over one real
// etcd member; the wait is a hang guard, the lease bound (lease + 1 s) the only timing.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "comm/elastic/rendezvous.h"
#include "comm/store/etcd_store.h"
#include "launch/membership_wake.h"
#include "tests/comm/etcd_cluster.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

TEST(EtcdMembershipWake, AMembersLeaseEndingWakesTheAgentWithoutARecordWrite) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster(1);
  auto store = [&] {
    comm::EtcdStoreOptions o;
    o.endpoints = cluster.endpoints();
    o.prefix = "/mw/";
    o.timeout = 30s;
    return std::make_unique<comm::EtcdStore>(o);
  };
  auto sa = store(), sb = store(), sc = store(), swake = store();
  auto options = [](const std::string& node) {
    comm::RendezvousOptions o;
    o.run_id = "job";
    o.node_id = node;
    o.min_nodes = 1;
    o.max_nodes = 3;
    o.heartbeat_interval = 200ms;
    o.heartbeat_timeout = 1s;  // the test's members grant 1 s leases
    o.poll_interval = 20ms;
    o.last_call = 0s;
    o.join_timeout = 60s;
    return o;
  };
  comm::Rendezvous a(*sa, options("a")), b(*sb, options("b")), c(*sc, options("c"));
  {
    auto ja = std::async(std::launch::async, [&] { return a.join(); });
    auto jb = std::async(std::launch::async, [&] { return b.join(); });
    auto jc = std::async(std::launch::async, [&] { return c.join(); });
    ja.get(), jb.get(), jc.get();
  }
  for (comm::Rendezvous* r : {&a, &b, &c})
    while (r->membership()->world() < 3) ASSERT_TRUE(r->watch(20s).has_value());

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

}  // namespace
}  // namespace weft::test
