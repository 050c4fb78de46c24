// EtcdStore against a real etcd (one member per test, tests/comm/etcd_cluster.h): the Store
// contract as store_test.cc checks it, etcd's own limits and lease bookkeeping, failover
// from a dead endpoint, and comm/elastic's Rendezvous over it. Skips only without
// /usr/bin/etcd. Durations are printed, never asserted.
#include "comm/store/etcd_store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/elastic/rendezvous.h"
#include "comm/store/etcd_http.h"
#include "tests/comm/etcd_cluster.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::Bytes;
using comm::EtcdStore;
using comm::EtcdStoreOptions;
using comm::Millis;
using comm::to_bytes;
using Clock = std::chrono::steady_clock;


// A port nothing listens on (bound, then closed: connecting is refused).
std::string dead_endpoint() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_ETCD();
    cluster_ = std::make_unique<EtcdCluster>(1);
  }

  // A new client (its own connection), as another process would have.
  std::unique_ptr<EtcdStore> client(Millis timeout = 10s, const std::string& prefix = "/t/") {
    EtcdStoreOptions o;
    o.endpoints = cluster_->endpoints();
    o.prefix = prefix;
    o.timeout = timeout;
    return std::make_unique<EtcdStore>(o);
  }

  // Leases alive in the cluster now (etcd's LeaseLeases).
  size_t leases() {
    comm::EtcdHttp http({comm::parse_etcd_endpoint(cluster_->endpoint(0), "test")}, 2s, 2s);
    auto r = http.post("/v3/lease/leases", nlohmann::json::object(), comm::Replay::kSafe);
    return r.contains("leases") ? r["leases"].size() : 0;
  }

  std::unique_ptr<EtcdCluster> cluster_;
};

TEST_F(EtcdStoreTest, SetGetKeepsBytesExactly) {
  auto s = client();
  Bytes binary = {0, 1, 2, 255, 0, 127};
  s->set("bin", binary);
  s->set("empty", {});
  s->set_string("text", "hello");
  EXPECT_EQ(s->get("bin"), binary);
  EXPECT_EQ(s->get("empty"), Bytes{});
  EXPECT_TRUE(s->check({"empty"})) << "an empty value is still a key";
  EXPECT_EQ(s->get_string("text"), "hello");
  s->set_string("text", "overwritten");
  EXPECT_EQ(s->get_string("text"), "overwritten");
  EXPECT_EQ(client(10s, "/other/")->num_keys(), 0) << "another prefix sees none of them";
}

TEST_F(EtcdStoreTest, GetBlocksUntilAnotherClientSets) {
  auto reader = client();
  auto writer = client();
  ASSERT_FALSE(writer->check({"late"}));
  auto got = std::async(std::launch::async, [&] { return reader->get_string("late"); });
  std::this_thread::sleep_for(50ms);  // lets the reader block first (passes either way)
  writer->set_string("late", "value");
  EXPECT_EQ(got.get(), "value");
}

TEST_F(EtcdStoreTest, BlockedGetDoesNotHoldUpOtherThreadsOfTheSameClient) {
  auto s = client();
  auto blocked = std::async(std::launch::async, [&] { return s->get_string("later"); });
  std::this_thread::sleep_for(50ms);
  for (int i = 0; i < 20; ++i)
    s->set_string(std::string("k") + std::to_string(i), "v");  // same client
  EXPECT_EQ(s->num_keys(), 20);
  s->set_string("later", "x");
  EXPECT_EQ(blocked.get(), "x");
}

TEST_F(EtcdStoreTest, GetTimesOutWithTimeoutErrorNamingTheKey) {
  auto s = client();
  s->set_timeout(300ms);
  EXPECT_EQ(s->timeout(), 300ms);
  auto start = Clock::now();
  try {
    s->get("missing-key");
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing-key"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 300ms) << "gave up before its timeout";
}

TEST_F(EtcdStoreTest, WaitTimesOutWhenAnyKeyIsMissingAndIsReleasedByMultiSet) {
  auto waiter = client();
  auto writer = client();
  writer->set_string("present", "1");
  auto start = Clock::now();
  try {
    waiter->wait({"present", "absent"}, 300ms);
    FAIL() << "wait returned with a key missing";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 300ms);
  waiter->wait({"present"}, 300ms);
  waiter->wait({}, 0ms);
  auto released = std::async(std::launch::async, [&] { waiter->wait({"a", "b", "c"}, 20s); });
  writer->set_string("a", "1");
  writer->multi_set({"b", "c"}, {to_bytes("2"), to_bytes("3")});
  released.get();  // rethrows a TimeoutError
}

TEST_F(EtcdStoreTest, AddCountsFromZeroAndStoresDecimalText) {
  auto s = client();
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -7), -2);
  EXPECT_EQ(s->add("n", 0), -2);
  EXPECT_EQ(s->get_string("n"), "-2");
  s->set_string("n2", "40");
  EXPECT_EQ(s->add("n2", 2), 42);
  s->set_string("text", "forty");
  EXPECT_THROW(s->add("text", 1), CommError);
  EXPECT_EQ(s->get_string("text"), "forty") << "a refused add must not write";
  s->set_string("big", std::to_string(INT64_MAX));
  EXPECT_THROW(s->add("big", 1), CommError);
}

TEST_F(EtcdStoreTest, CompareSetSemantics) {
  auto s = client();
  EXPECT_EQ(s->compare_set("k", {}, to_bytes("v1")), to_bytes("v1"));
  EXPECT_EQ(s->compare_set("k", to_bytes("v1"), to_bytes("v2")), to_bytes("v2"));
  EXPECT_EQ(s->compare_set("k", to_bytes("v1"), to_bytes("v3")), to_bytes("v2"));
  EXPECT_EQ(s->get_string("k"), "v2");
  EXPECT_EQ(s->compare_set("absent", to_bytes("x"), to_bytes("y")), Bytes{});
  EXPECT_FALSE(s->check({"absent"}));
  EXPECT_EQ(s->compare_set("k", {}, to_bytes("v4")), to_bytes("v2"));
  // An empty expected also matches a key that holds the empty value.
  s->set("e", {});
  EXPECT_EQ(s->compare_set("e", {}, to_bytes("filled")), to_bytes("filled"));
  EXPECT_EQ(s->get_string("e"), "filled");
}

TEST_F(EtcdStoreTest, CheckEraseAndNumKeys) {
  auto s = client();
  EXPECT_EQ(s->num_keys(), 0);
  s->set_string("a", "1");
  s->set_string("b", "2");
  s->set_string("dir/c", "3");
  client(10s, "/t-other/")->set_string("x", "not ours");  // "/t-other/x" > "/t/"'s range
  EXPECT_EQ(s->num_keys(), 3);
  EXPECT_EQ(s->num_keys_with_prefix("dir/"), 1);
  EXPECT_EQ(s->num_keys_with_prefix("zzz"), 0);
  EXPECT_TRUE(s->check({"a", "b"}));
  EXPECT_FALSE(s->check({"a", "zzz"}));
  EXPECT_TRUE(s->erase("a"));
  EXPECT_FALSE(s->erase("a"));
  EXPECT_FALSE(s->check({"a"}));
  EXPECT_EQ(s->num_keys(), 2);
}

TEST_F(EtcdStoreTest, AppendCreatesThenExtends) {
  auto s = client();
  s->append("log", to_bytes("ab"));
  s->append("log", to_bytes("cd"));
  EXPECT_EQ(s->get_string("log"), "abcd");
}

TEST_F(EtcdStoreTest, MultiGetAndMultiSet) {
  auto s = client();
  s->multi_set({"x", "y", "z"}, {to_bytes("1"), to_bytes(""), to_bytes("3")});
  auto v = s->multi_get({"z", "x", "y"});
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0], to_bytes("3"));
  EXPECT_EQ(v[1], to_bytes("1"));
  EXPECT_EQ(v[2], Bytes{});
  s->multi_set({"d", "d"}, {to_bytes("first"), to_bytes("last")});
  EXPECT_EQ(s->get_string("d"), "last") << "a repeated key: the last value wins";
  EXPECT_THROW(s->multi_set({"p", "q"}, {to_bytes("1")}), CommError);
  // More keys than one read txn holds (64): read in several.
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 100; ++i) {
    keys.push_back("many/" + std::to_string(i));
    values.push_back(to_bytes(std::to_string(i * i)));
  }
  s->multi_set(keys, values);
  EXPECT_EQ(s->multi_get(keys), values);
  s->set_timeout(200ms);
  EXPECT_THROW(s->multi_get({"x", "nope"}), TimeoutError);
}

TEST_F(EtcdStoreTest, ValuesOverEtcdsRequestLimitAreRefusedWithEtcdsMessage) {
  auto s = client();
  Bytes too_big(2 << 20, 7);  // etcd's default --max-request-bytes is 1.5 MiB
  try {
    s->set("big", too_big);
    FAIL() << "etcd took a 2 MiB value";
  } catch (const CommError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("etcd at " + cluster_->endpoint(0)), std::string::npos) << m;
    EXPECT_NE(m.find("larger than max"), std::string::npos) << m;
  }
  EXPECT_FALSE(s->check({"big"}));
  s->set("edge", Bytes(512 << 10, 1));
  EXPECT_EQ(s->get("edge").size(), size_t(512 << 10));
  EXPECT_THROW(s->multi_set({"m1", "m2"}, {Bytes(1, 1), too_big}), CommError);
  EXPECT_FALSE(s->check({"m1"})) << "multi_set is all or nothing";
  s->set_string("after", "ok");
  EXPECT_EQ(s->get_string("after"), "ok");
}

// TTLs are leases of whole seconds (1 s is this cluster's minimum): asserted only as "gone
// eventually" and "the others stay".
TEST_F(EtcdStoreTest, TtlKeysExpireAndOthersStay) {
  auto s = client();
  const auto set_at = Clock::now();
  s->set("heartbeat", to_bytes("alive"), 50ms);
  s->set("permanent", to_bytes("1"));
  s->set("long", to_bytes("1"), Millis(600'000));
  s->set("longest", to_bytes("1"), Millis::max());  // clamped, not overflowed
  EXPECT_TRUE(s->check({"heartbeat"}));
  ASSERT_TRUE(eventually([&] { return !s->check({"heartbeat"}); })) << "TTL key never expired";
  std::printf("[ measure ] a 50 ms TTL key (a 1 s lease) was gone %.0f ms after its set\n",
              ms_since(set_at));
  EXPECT_TRUE(s->check({"permanent", "long", "longest"}));
  EXPECT_EQ(s->num_keys(), 3);
  s->set_timeout(100ms);
  EXPECT_THROW(s->get("heartbeat"), TimeoutError) << "an expired key is absent for get too";
}

// etcd's leases end by TTL only: a key bound to the connection is refused, never written as
// a plain key in silence, and a heartbeat over etcd is a TTL key and says so.
TEST_F(EtcdStoreTest, KeysBoundToTheConnectionAreRefusedAndHeartbeatsStayTtlKeys) {
  auto s = client();
  EXPECT_FALSE(s->binds_to_connection());
  EXPECT_THROW(s->set("bound", to_bytes("v"), comm::SetOptions{.bind = true}), NotSupported);
  EXPECT_FALSE(s->check({"bound"}));
  s->set("ttl", to_bytes("v"), comm::SetOptions{.ttl = Millis(600'000)});
  EXPECT_TRUE(s->check({"ttl"}));
  comm::Heartbeat hb(*s, "alive/n", 1s, 5s, "beat/n");
  EXPECT_FALSE(hb.bound());
  hb.start();
  EXPECT_TRUE(s->check({"alive/n"}));
  EXPECT_FALSE(s->check({"beat/n"})) << "no witness without a bound key";
  EXPECT_TRUE(hb.stop_and_erase());
}

TEST_F(EtcdStoreTest, SetWithoutTtlMakesAKeyPermanentAndAddAppendCasKeepTheTtl) {
  auto s = client();
  s->set("k", to_bytes("1"), 1s);
  s->set("k", to_bytes("2"));  // clears the expiry
  s->set("counter", to_bytes("0"), 1s);
  EXPECT_EQ(s->add("counter", 1), 1);  // keeps the expiry
  s->set("log", to_bytes("a"), 1s);
  s->append("log", to_bytes("b"));
  s->set("cas", to_bytes("x"), 1s);
  EXPECT_EQ(s->compare_set("cas", to_bytes("x"), to_bytes("y")), to_bytes("y"));
  ASSERT_TRUE(eventually(
      [&] { return !s->check({"counter"}) && !s->check({"log"}) && !s->check({"cas"}); }));
  EXPECT_EQ(s->get_string("k"), "2");
}

TEST_F(EtcdStoreTest, SettingATtlKeyAgainRevokesItsPreviousLease) {
  auto s = client();
  const size_t before = leases();
  for (int i = 0; i < 20; ++i) s->set("beat", to_bytes(std::to_string(i)), 60s);
  EXPECT_EQ(leases(), before + 1) << "heartbeats pile up leases";
  EXPECT_EQ(s->get_string("beat"), "19");
  s->set("beat", to_bytes("permanent"));
  EXPECT_EQ(leases(), before) << "a set without TTL leaves the old lease behind";
  s->set("gone", to_bytes("x"), 60s);
  EXPECT_TRUE(s->erase("gone"));
  EXPECT_EQ(leases(), before) << "erase leaves the key's lease behind";
  EXPECT_EQ(s->get_string("beat"), "permanent");
}

TEST_F(EtcdStoreTest, ConcurrentAddsAndCompareSetsFromThreadsAreExact) {
  constexpr int kClients = 8, kAdds = 40, kCas = 10;
  std::vector<std::unique_ptr<EtcdStore>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(client());
  auto shared = client();  // and threads sharing one client
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      try {
        auto& s = *clients[i];
        for (int j = 0; j < kAdds; ++j) {
          s.add("adds", 1);
          shared->add("shared_adds", 1);
        }
        // CAS increment carrying the writer, so "it returned my value" means my write landed.
        for (int j = 0; j < kCas; ++j) {
          Bytes cur = s.compare_set("cas", {}, to_bytes("0"));
          for (;;) {
            std::string v = comm::to_string(cur);
            Bytes next = to_bytes(std::to_string(std::stoll(v) + 1) + "/" + std::to_string(i) +
                                  "/" + std::to_string(j));
            Bytes now = s.compare_set("cas", cur, next);
            if (now == next) break;
            cur = now;
          }
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread %d: %s\n", i, e.what());
        ++errors;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, 0);
  EXPECT_EQ(shared->get_string("adds"), std::to_string(kClients * kAdds));
  EXPECT_EQ(shared->get_string("shared_adds"), std::to_string(kClients * kAdds));
  EXPECT_EQ(std::stoll(shared->get_string("cas")), kClients * kCas);
}

TEST_F(EtcdStoreTest, FailsOverFromADeadFirstEndpoint) {
  EtcdStoreOptions o;
  o.endpoints = {dead_endpoint(), cluster_->endpoint(0)};
  o.prefix = "/t/";
  EtcdStore s(o);
  s.set_string("k", "v");
  EXPECT_EQ(s.get_string("k"), "v");
  EXPECT_EQ(s.endpoint(), cluster_->endpoint(0)) << "stays with the member that answered";
}

TEST_F(EtcdStoreTest, FactoryGivesAPingedStore) {
  auto s = comm::make_etcd_store(comm::parse_etcd_endpoints(" " + cluster_->endpoint(0) + " "),
                                 "/factory/", 5s);
  EXPECT_EQ(s->timeout(), 5s);
  s->set_string("k", "v");
  EXPECT_EQ(s->get_string("k"), "v");
  EXPECT_EQ(client(10s, "/factory/")->get_string("k"), "v");
}

// --- Without etcd ------------------------------------------------------------------------

TEST(EtcdStoreOffline, NoMemberReachableIsACommErrorNamingEachEndpoint) {
  std::string a = dead_endpoint(), b = dead_endpoint();
  EtcdStoreOptions o;
  o.endpoints = {a, b};
  o.request_timeout = 300ms;
  o.failover_timeout = 300ms;
  EtcdStore s(o);  // does not connect yet
  try {
    s.set_string("k", "v");
    FAIL() << "set without etcd returned";
  } catch (const TimeoutError& e) {
    FAIL() << "unreachable must be CommError, not TimeoutError: " << e.what();
  } catch (const CommError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(a), std::string::npos) << m;
    EXPECT_NE(m.find(b), std::string::npos) << m;
    EXPECT_NE(m.find("refused"), std::string::npos) << m;
  }
  EXPECT_THROW(comm::make_etcd_store({a}, "/x/", 1s), CommError);
}

TEST(EtcdStoreOffline, BadEndpointsAreConfigErrorsNamingTheFlag) {
  EXPECT_EQ(comm::parse_etcd_endpoints("h1:2379,http://h2:2379,[::1]:2379"),
            (std::vector<std::string>{"h1:2379", "http://h2:2379", "[::1]:2379"}));
  for (const char* bad : {"", "host", "host:", "host:0", "host:99999", "host:12x", ",h:1",
                          "https://h:2379", "::1:2379"}) {
    try {
      comm::parse_etcd_endpoints(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "--rdzv-endpoint") << bad;
    }
  }
  EXPECT_THROW(EtcdStore(EtcdStoreOptions{}), ConfigError) << "no endpoints";
}

// --- Rendezvous over etcd ----------------------------------------------------------------

comm::RendezvousOptions rdzv_options(const std::string& node) {
  comm::RendezvousOptions o;
  o.run_id = "job";
  o.node_id = node;
  o.min_nodes = 2;
  o.max_nodes = 3;
  o.heartbeat_interval = 200ms;
  o.heartbeat_timeout = 1s;  // a 1 s lease
  o.poll_interval = 20ms;
  o.last_call = 5s;
  o.join_timeout = 30s;
  return o;
}

TEST_F(EtcdStoreTest, RendezvousSurvivorsFormANewEpochWithoutTheNodeWhoseHeartbeatStopped) {
  // Three agents, each with its own connection as on three machines.
  std::vector<std::unique_ptr<EtcdStore>> stores;
  std::vector<std::unique_ptr<comm::Rendezvous>> agents;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(client(10s, "/weft/"));
    agents.push_back(std::make_unique<comm::Rendezvous>(
        *stores[i], rdzv_options(std::string("n") + std::to_string(i))));
  }
  std::vector<std::future<comm::Membership>> joins;
  for (auto& a : agents)
    joins.push_back(std::async(std::launch::async, [&a] { return a->join(); }));
  std::vector<comm::Membership> ms;
  for (auto& j : joins) ms.push_back(j.get());
  std::set<int> ranks;
  for (const auto& m : ms) {
    EXPECT_EQ(m.epoch, 1);
    EXPECT_EQ(m.world(), 3);
    EXPECT_EQ(m.members, ms[0].members);
    ranks.insert(m.node_rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  // n1 "dies": its heartbeat stops, it never polls again.
  const auto stopped = Clock::now();
  agents[1]->heartbeat().stop();
  for (int i : {0, 2}) {
    auto m = agents[i]->watch(20s);
    ASSERT_TRUE(m.has_value()) << "no new epoch";
    EXPECT_EQ(m->epoch, 2);
    EXPECT_EQ(m->world(), 2);
    for (const auto& member : m->members) EXPECT_NE(member.node_id, "n1");
    EXPECT_EQ(m->node_rank, ms[i].node_rank) << "a survivor's rank changed";
    std::printf("[ measure ] n%d: heartbeat stopped -> epoch 2 over etcd: %.0f ms (1 s TTL)\n", i,
                ms_since(stopped));
  }
}

}  // namespace
}  // namespace weft::test
