// EtcdStore over a three-member etcd cluster on loopback that loses the member the store
// talks to (SIGKILL; the raft leader, chosen on purpose, so an election happens too): the
// store keeps working through the other two, and a Rendezvous over it keeps its membership.
// Durations are printed, never asserted.
#include "tests/comm/etcd_cluster.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/elastic/rendezvous.h"
#include "comm/store/etcd_http.h"
#include "comm/store/etcd_store.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::Bytes;
using comm::EtcdStore;
using comm::EtcdStoreOptions;
using comm::to_bytes;
using Clock = std::chrono::steady_clock;


class EtcdClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_ETCD();
    cluster_ = std::make_unique<EtcdCluster>(3);
    ASSERT_TRUE(eventually([&] { return (leader_ = cluster_->leader()) >= 0; })) << "no leader";
  }

  // Every member, the leader first: a store talks to the first that answers, so killing
  // the leader kills the member it talks to and forces an election as well.
  EtcdStoreOptions leader_first(const std::string& prefix) {
    EtcdStoreOptions o;
    o.endpoints = {cluster_->endpoint(leader_)};
    for (int i = 0; i < cluster_->size(); ++i)
      if (i != leader_) o.endpoints.push_back(cluster_->endpoint(i));
    o.prefix = prefix;
    o.timeout = 10s;
    // A write that reached a follower just as the leader died waits for etcd's own 5 s
    // timeout; after 1 s the store tries the next member, which by then has a new leader.
    o.request_timeout = 1s;
    return o;
  }

  std::unique_ptr<EtcdCluster> cluster_;
  int leader_ = -1;
};

TEST_F(EtcdClusterTest, StoreKeepsWorkingWhenTheMemberItTalksToIsKilled) {
  EtcdStore s(leader_first("/c/"));
  s.set_string("before", "1");
  s.set("beat", to_bytes("x"), 60s);
  ASSERT_EQ(s.endpoint(), cluster_->endpoint(leader_));
  const std::string killed = cluster_->endpoint(leader_);
  const auto t0 = Clock::now();
  cluster_->kill(leader_);

  s.set_string("after", "2");  // goes to another member
  std::printf("[ measure ] first write after SIGKILL of the leader it talked to: %.0f ms\n",
              ms_since(t0));
  EXPECT_NE(s.endpoint(), killed);
  EXPECT_EQ(s.get_string("before"), "1") << "data committed before the loss";
  EXPECT_EQ(s.get_string("after"), "2");
  EXPECT_EQ(s.compare_set("after", to_bytes("2"), to_bytes("3")), to_bytes("3"));
  EXPECT_EQ(s.compare_set("after", to_bytes("2"), to_bytes("4")), to_bytes("3"));
  EXPECT_EQ(s.compare_set("new", {}, to_bytes("n")), to_bytes("n"));
  EXPECT_EQ(s.add("count", 2), 2);
  EXPECT_EQ(s.add("count", 3), 5);
  s.append("log", to_bytes("a"));
  s.append("log", to_bytes("b"));
  EXPECT_EQ(s.get_string("log"), "ab");
  s.multi_set({"m1", "m2"}, {to_bytes("1"), to_bytes("2")});
  EXPECT_EQ(s.multi_get({"m2", "m1"}), (std::vector<Bytes>{to_bytes("2"), to_bytes("1")}));
  // TTLs still work: a lease granted by the new leader expires there.
  s.set("ttl", to_bytes("x"), 1s);
  EXPECT_TRUE(s.check({"ttl"}));
  ASSERT_TRUE(eventually([&] { return !s.check({"ttl"}); })) << "a TTL key never expired";
  s.set("beat", to_bytes("y"), 60s);  // a heartbeat through the new leader
  EXPECT_EQ(s.get_string("beat"), "y");
  EXPECT_TRUE(s.erase("new"));
  EXPECT_EQ(s.num_keys(), 7);  // before, beat, after, count, log, m1, m2

  // A client created now, the dead member first in its list, finds the survivors.
  EtcdStore fresh(leader_first("/c/"));
  EXPECT_EQ(fresh.get_string("after"), "3");
  EXPECT_NE(fresh.endpoint(), killed);
  int now_leader = -1;
  ASSERT_TRUE(eventually([&] { return (now_leader = cluster_->leader()) >= 0; }));
  EXPECT_NE(now_leader, leader_) << "the killed member cannot lead";
}

TEST_F(EtcdClusterTest, AGetParkedOnTheLeadersWatchIsWokenBySetAfterTheLeaderIsKilled) {
  EtcdStore waiter(leader_first("/c/"));
  EtcdStore writer(leader_first("/c/"));
  ASSERT_FALSE(writer.check({"late"}));
  const std::string killed = cluster_->endpoint(leader_);
  ASSERT_EQ(waiter.endpoint(), killed);
  auto got = std::async(std::launch::async, [&] { return waiter.get_string("late"); });
  std::this_thread::sleep_for(200ms);  // parked on the leader's watch by now (passes either way)
  cluster_->kill(leader_);
  const auto t0 = Clock::now();
  writer.set_string("late", "after the kill");
  const double set_ms = ms_since(t0);
  EXPECT_EQ(got.get(), "after the kill");
  std::printf(
      "[ measure ] after SIGKILL of the leader: set in %.0f ms, the parked get "
      "returned at %.0f ms\n",
      set_ms, ms_since(t0));
  EXPECT_NE(waiter.endpoint(), killed) << "the waiter's reads moved to a survivor";
}

// An add sent to a follower just as the leader is SIGKILLed: the follower forwards it to the
// dead leader, where raft loses it, and would answer only after etcd's own request timeout
// (5.5 s with these members). The store asks the member, while it waits, whether it named a
// new leader, and gives up the attempt once it has (an add is not resent: the outcome is
// unknown, and the error says why). request_timeout is a minute, so only that can end it.
TEST_F(EtcdClusterTest, AnAddForwardedToAKilledLeaderEndsWhenTheMemberNamesANewLeader) {
  EtcdStoreOptions o = leader_first("/c/");
  std::rotate(o.endpoints.begin(), o.endpoints.begin() + 1, o.endpoints.end());  // a follower
  o.request_timeout = 60s;
  o.failover_timeout = 60s;
  EtcdStore s(o);
  EXPECT_EQ(s.add("n", 1), 1);  // through the follower: the store knows its raft term
  ASSERT_NE(s.endpoint(), cluster_->endpoint(leader_));
  cluster_->kill(leader_);
  const auto t0 = Clock::now();
  try {
    const int64_t n = s.add("n", 1);
    // The follower heard of the death before it forwarded the add ("no leader", sent again).
    std::printf("[ measure ] the add landed (%lld) after %.0f ms\n", (long long)n, ms_since(t0));
    EXPECT_EQ(n, 2);
  } catch (const CommError& e) {
    std::printf("[ measure ] the add gave up after %.0f ms: %s\n", ms_since(t0), e.what());
    EXPECT_NE(std::string(e.what()).find("named a new leader"), std::string::npos) << e.what();
  }
  // Whatever became of it, the next calls go on.
  s.set_string("after", "1");
  EXPECT_EQ(s.get_string("after"), "1");
}

TEST_F(EtcdClusterTest, RendezvousKeepsItsMembershipWhenTheEtcdMemberItTalksToIsKilled) {
  comm::RendezvousOptions base;
  base.run_id = "job";
  base.min_nodes = 2;
  base.max_nodes = 3;
  base.heartbeat_interval = 250ms;
  base.heartbeat_timeout = 3s;  // > an election + a beat stuck for request_timeout (1 s)
  base.poll_interval = 20ms;
  base.last_call = 5s;
  base.join_timeout = 30s;
  std::vector<std::unique_ptr<EtcdStore>> stores;
  std::vector<std::unique_ptr<comm::Rendezvous>> agents;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(std::make_unique<EtcdStore>(leader_first("/weft/")));
    comm::RendezvousOptions o = base;
    o.node_id = std::string("n") + std::to_string(i);
    agents.push_back(std::make_unique<comm::Rendezvous>(*stores[i], o));
  }
  std::vector<std::future<comm::Membership>> joins;
  for (auto& a : agents)
    joins.push_back(std::async(std::launch::async, [&a] { return a->join(); }));
  std::vector<comm::Membership> ms;
  for (auto& j : joins) ms.push_back(j.get());
  for (const auto& m : ms) {
    ASSERT_EQ(m.epoch, 1);
    ASSERT_EQ(m.world(), 3);
  }

  const std::string killed = cluster_->endpoint(leader_);
  for (auto& s : stores) ASSERT_EQ(s->endpoint(), killed);
  std::vector<uint64_t> beats_at_kill;
  for (auto& a : agents) beats_at_kill.push_back(a->heartbeat().beats());
  cluster_->kill(leader_);

  // Longer than a heartbeat TTL and etcd's 0.5 s expiry check: a node whose beats had
  // stopped reaching etcd would be declared lost in this window. Nobody is, and no epoch
  // is formed.
  const auto window = base.heartbeat_timeout + 2s;
  const auto until = Clock::now() + window;
  int polls = 0;
  while (Clock::now() < until) {
    for (auto& a : agents) EXPECT_EQ(a->poll_change(), std::nullopt) << "the membership changed";
    ++polls;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(agents[0]->read_record().epoch, 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(stores[i]->endpoint(), killed);
    EXPECT_GT(agents[i]->heartbeat().beats(), beats_at_kill[i] + 5)
        << "n" << i << " stopped beating";
    EXPECT_EQ(agents[i]->heartbeat().failure(), std::nullopt) << *agents[i]->heartbeat().failure();
  }
  std::printf("[ measure ] %d polls per agent over %.0f s after the kill: epoch stayed 1\n", polls,
              std::chrono::duration<double>(window).count());

  // And the rendezvous still works on two etcd members: n2 dies, n0 and n1 go on.
  const auto t0 = Clock::now();
  agents[2]->heartbeat().stop();
  for (int i : {0, 1}) {
    auto m = agents[i]->watch(20s);
    ASSERT_TRUE(m.has_value()) << "no new epoch";
    EXPECT_EQ(m->epoch, 2);
    EXPECT_EQ(m->world(), 2);
    EXPECT_EQ(m->node_rank, ms[i].node_rank);
  }
  std::printf("[ measure ] n2's heartbeat stopped -> epoch 2 on two etcd members: %.0f ms\n",
              ms_since(t0));
}

// The leader's raft index: every proposal (a put, a txn that may write, a lease grant)
// advances it; a linearizable read does not.
uint64_t raft_index(const EtcdCluster& cluster, int leader) {
  comm::EtcdHttp http({comm::parse_etcd_endpoint(cluster.endpoint(leader), "test")}, 1s, 1s);
  auto r = http.post("/v3/maintenance/status", nlohmann::json::object(), comm::Replay::kSafe);
  return std::stoull(r.value("raftIndex", std::string("0")));
}

// Agents read the restart round at every monitor pass. Over etcd a write is a raft proposal,
// which a follower forwards to its leader and which is lost without an answer when that
// leader dies at that moment: the pass then ran out its request timeout (2 s) while the
// survivors' new epoch waited (issue 14, NetnsEtcd.Killed...). So the round is read: it lives
// in the membership record, and looking at it proposes nothing, while asking for the next
// round (a compare_set of the record, as an agent whose workers failed does) does.
TEST_F(EtcdClusterTest, RestartRoundAndMembershipPollsProposeNoRaftWrite) {
  comm::RendezvousOptions o;
  o.run_id = "job";
  o.node_id = "n0";
  EtcdStore store(leader_first("/weft/"));
  comm::Rendezvous rdzv(store, o);
  EXPECT_EQ(rdzv.restart_round(), 0);  // creates the record: one proposal
  const uint64_t before = raft_index(*cluster_, leader_);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(rdzv.restart_round(), 0);
  EXPECT_EQ(raft_index(*cluster_, leader_), before) << "asking for the round proposed a write";
  EXPECT_EQ(rdzv.ask_round(0), 1);  // the next round
  EXPECT_GT(raft_index(*cluster_, leader_), before) << "the index does not measure proposals";
  const uint64_t after_ask = raft_index(*cluster_, leader_);
  EXPECT_EQ(rdzv.restart_round(), 1);
  EXPECT_EQ(raft_index(*cluster_, leader_), after_ask);

  // The membership poll, which agents also make at every monitor pass, reads the record
  // the same way (the heartbeat, a writer by nature, is stopped first).
  o.min_nodes = o.max_nodes = 1;
  o.heartbeat_timeout = 30s;
  o.node_id = "n1";
  o.run_id = "polls";
  comm::Rendezvous alone(store, o);
  ASSERT_EQ(alone.join().world(), 1);
  alone.heartbeat().stop();
  const uint64_t joined = raft_index(*cluster_, leader_);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(alone.poll_change(), std::nullopt);
  EXPECT_EQ(raft_index(*cluster_, leader_), joined) << "a membership poll proposed a write";
}

}  // namespace
}  // namespace weft::test
