// Store tests: the Store contract checked on every implementation (in-memory, TCP, prefix
// over TCP), then what only the TCP server promises: one connection holding many waits,
// clients that vanish or misbehave, per-client memory bounds, and `weft store`.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "comm/store/in_memory_store.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "tests/comm/store_raw_client.h"
#include "tests/support/eventually.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::Bytes;
using comm::InMemoryStore;
using comm::Millis;
using comm::PrefixStore;
using comm::Store;
using comm::TCPStore;
using comm::TCPStoreServer;
using comm::TCPStoreServerOptions;
using comm::to_bytes;
using comm::wire::Op;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxValue = 64 << 10;

// --- The contract, on every implementation -------------------------------------------

class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      memory_ = std::make_shared<InMemoryStore>(Millis(10'000), kMaxValue);
    } else {
      server_ =
          std::make_unique<TCPStoreServer>(TCPStoreServerOptions{.max_value_bytes = kMaxValue});
    }
  }

  // Another client of the same store: a new connection for TCP, the shared object in memory.
  std::shared_ptr<Store> client(Millis timeout = 10s) {
    if (memory_) return memory_;
    auto tcp = std::make_shared<TCPStore>("127.0.0.1", server_->port(), timeout);
    if (GetParam() == "prefix") return std::make_shared<PrefixStore>("epoch/7", tcp);
    return tcp;
  }

  std::shared_ptr<InMemoryStore> memory_;
  std::unique_ptr<TCPStoreServer> server_;
};

INSTANTIATE_TEST_SUITE_P(AllStores, StoreContract, ::testing::Values("memory", "tcp", "prefix"),
                         [](const auto& info) { return info.param; });

TEST_P(StoreContract, SetGetKeepsBytesExactly) {
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
}

TEST_P(StoreContract, GetBlocksUntilAnotherClientSets) {
  auto reader = client();
  auto writer = client();
  ASSERT_FALSE(writer->check({"late"}));
  std::string got;
  std::thread t([&] { got = reader->get_string("late"); });
  std::this_thread::sleep_for(50ms);  // lets the reader block first (the test passes either way)
  writer->set_string("late", "value");
  t.join();
  EXPECT_EQ(got, "value");
}

TEST_P(StoreContract, GetTimesOutWithTimeoutErrorNamingTheKey) {
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

TEST_P(StoreContract, WaitTimesOutWhenAnyKeyIsMissing) {
  auto s = client();
  s->set_string("present", "1");
  auto start = Clock::now();
  EXPECT_THROW(s->wait({"present", "absent"}, 300ms), TimeoutError);
  auto took = Clock::now() - start;
  EXPECT_GE(took, 300ms);
  s->wait({"present"}, 300ms);  // all present: returns
  s->wait({}, 0ms);             // nothing to wait for
}

TEST_P(StoreContract, WaitIsReleasedByMultiSetFromAnotherClient) {
  auto waiter = client();
  auto writer = client();
  std::exception_ptr err;
  std::thread t([&] {
    try {
      waiter->wait({"a", "b", "c"}, 20s);
    } catch (...) {
      err = std::current_exception();
    }
  });
  writer->set_string("a", "1");
  writer->multi_set({"b", "c"}, {to_bytes("2"), to_bytes("3")});
  t.join();
  EXPECT_FALSE(err);
}

TEST_P(StoreContract, AddCountsFromZeroAndStoresDecimalText) {
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

TEST_P(StoreContract, CompareSetSemantics) {
  auto s = client();
  // Absent key, empty expected: creates.
  EXPECT_EQ(s->compare_set("k", {}, to_bytes("v1")), to_bytes("v1"));
  // Matching expected: writes.
  EXPECT_EQ(s->compare_set("k", to_bytes("v1"), to_bytes("v2")), to_bytes("v2"));
  // Stale expected: no write, returns the current value.
  EXPECT_EQ(s->compare_set("k", to_bytes("v1"), to_bytes("v3")), to_bytes("v2"));
  EXPECT_EQ(s->get_string("k"), "v2");
  // Absent key, non-empty expected: no write, returns empty (the key stays absent).
  EXPECT_EQ(s->compare_set("absent", to_bytes("x"), to_bytes("y")), Bytes{});
  EXPECT_FALSE(s->check({"absent"}));
  // Empty expected does not match a key holding a non-empty value.
  EXPECT_EQ(s->compare_set("k", {}, to_bytes("v4")), to_bytes("v2"));
}

TEST_P(StoreContract, CheckEraseAndNumKeys) {
  auto s = client();
  EXPECT_EQ(s->num_keys(), 0);
  s->set_string("a", "1");
  s->set_string("b", "2");
  s->set_string("dir/c", "3");
  EXPECT_EQ(s->num_keys(), 3);
  EXPECT_EQ(s->num_keys_with_prefix("dir/"), 1);
  EXPECT_TRUE(s->check({"a", "b"}));
  EXPECT_FALSE(s->check({"a", "zzz"}));
  EXPECT_TRUE(s->erase("a"));
  EXPECT_FALSE(s->erase("a"));
  EXPECT_FALSE(s->check({"a"}));
  EXPECT_EQ(s->num_keys(), 2);
}

TEST_P(StoreContract, AppendCreatesThenExtends) {
  auto s = client();
  s->append("log", to_bytes("ab"));
  s->append("log", to_bytes("cd"));
  EXPECT_EQ(s->get_string("log"), "abcd");
}

TEST_P(StoreContract, MultiGetAndMultiSet) {
  auto s = client();
  s->multi_set({"x", "y", "z"}, {to_bytes("1"), to_bytes(""), to_bytes("3")});
  auto v = s->multi_get({"z", "x", "y"});
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0], to_bytes("3"));
  EXPECT_EQ(v[1], to_bytes("1"));
  EXPECT_EQ(v[2], Bytes{});
  EXPECT_THROW(s->multi_set({"p", "q"}, {to_bytes("1")}), CommError);
  s->set_timeout(200ms);
  EXPECT_THROW(s->multi_get({"x", "nope"}), TimeoutError);
}

TEST_P(StoreContract, ValuesOverTheLimitAreRefusedAndNothingIsWritten) {
  auto s = client();
  Bytes too_big(kMaxValue + 1, 7);
  EXPECT_THROW(s->set("big", too_big), CommError);
  EXPECT_FALSE(s->check({"big"}));
  s->set("edge", Bytes(kMaxValue, 1));  // exactly the limit is fine
  EXPECT_THROW(s->append("edge", Bytes(1, 2)), CommError);
  EXPECT_EQ(s->get("edge").size(), kMaxValue);
  EXPECT_THROW(s->multi_set({"m1", "m2"}, {Bytes(1, 1), too_big}), CommError);
  EXPECT_FALSE(s->check({"m1"})) << "multi_set is all or nothing";
  // The client is still usable after a refusal.
  s->set_string("after", "ok");
  EXPECT_EQ(s->get_string("after"), "ok");
}

TEST_P(StoreContract, TtlKeysExpireAndOthersStay) {
  auto s = client();
  s->set("heartbeat", to_bytes("alive"), 50ms);
  s->set("permanent", to_bytes("1"));
  s->set("long", to_bytes("1"), Millis(600'000));
  s->set("longest", to_bytes("1"), Millis::max());  // clamped, not overflowed
  ASSERT_TRUE(eventually([&] { return !s->check({"heartbeat"}); })) << "TTL key never expired";
  EXPECT_TRUE(s->check({"permanent", "long", "longest"}));
  EXPECT_EQ(s->num_keys(), 3);
  s->set_timeout(100ms);
  EXPECT_THROW(s->get("heartbeat"), TimeoutError) << "an expired key is absent for get too";
}

TEST_P(StoreContract, SetWithoutTtlMakesAKeyPermanentAndAddKeepsTheTtl) {
  auto s = client();
  s->set("k", to_bytes("1"), 50ms);
  s->set("k", to_bytes("2"));  // clears the expiry
  s->set("counter", to_bytes("0"), 50ms);
  EXPECT_GE(s->add("counter", 1), 1);  // keeps the expiry
  ASSERT_TRUE(eventually([&] { return !s->check({"counter"}); }));
  EXPECT_EQ(s->get_string("k"), "2");
}

TEST_P(StoreContract, ConcurrentAddAndCompareSetAreExact) {
  constexpr int kClients = 32, kAdds = 100, kCas = 10;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(client());
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      try {
        auto& s = *clients[i];
        for (int j = 0; j < kAdds; ++j) s.add("adds", 1);
        // CAS increment: read, propose +1, retry with what came back until it lands. The
        // value carries the writer ("count/client/j") so that "it returned my value" can
        // only mean "my write landed", never another client's equal count.
        for (int j = 0; j < kCas; ++j) {
          Bytes cur = s.compare_set("cas", {}, to_bytes("0"));
          for (;;) {
            Bytes next = to_bytes(str(std::stoll(comm::to_string(cur)) + 1, "/", i, "/", j));
            Bytes now = s.compare_set("cas", cur, next);
            if (now == next) break;
            cur = now;
          }
        }
      } catch (...) {
        ++errors;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, 0);
  auto s = client();
  EXPECT_EQ(s->get_string("adds"), std::to_string(kClients * kAdds));
  EXPECT_EQ(std::stoll(s->get_string("cas")), kClients * kCas);
}

TEST_P(StoreContract, ManyThreadsShareOneClient) {
  // Replies must reach the caller that sent the request, whatever the interleaving.
  auto s = client();
  constexpr int kThreads = 16, kOps = 100;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        std::string key = str("t", t, "/", i);
        s->set_string(key, key);
        if (s->get_string(key) != key) ++wrong;
        if (s->add(str("t", t, "/n"), 1) != i + 1) ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, 0);
}

// --- PrefixStore -------------------------------------------------------------------------

TEST(PrefixStore, NamespacesAreIsolated) {
  TCPStoreServer server;
  auto base = std::make_shared<TCPStore>("127.0.0.1", server.port(), 10s);
  PrefixStore e7("epoch/7", base), e8("epoch/8", base);
  e7.set_string("rank0", "seven");
  e8.set_string("rank0", "eight");
  e7.add("joined", 2);
  EXPECT_EQ(e7.get_string("rank0"), "seven");
  EXPECT_EQ(e8.get_string("rank0"), "eight");
  EXPECT_EQ(base->get_string("epoch/7/rank0"), "seven") << "the prefix is '<prefix>/'";
  EXPECT_EQ(e7.num_keys(), 2);
  EXPECT_EQ(e8.num_keys(), 1);
  EXPECT_EQ(base->num_keys(), 3);
  EXPECT_FALSE(e8.check({"joined"}));
  EXPECT_THROW(e8.wait({"joined"}, 100ms), TimeoutError);
  EXPECT_FALSE(e8.erase("joined"));
  EXPECT_TRUE(e7.check({"joined"}));
  // Nesting composes, and "epoch/7" does not leak into "epoch/70".
  auto e70 = std::make_shared<PrefixStore>("epoch/70", base);
  PrefixStore nested("agents", e70);
  nested.set_string("a0", "x");
  EXPECT_EQ(base->get_string("epoch/70/agents/a0"), "x");
  EXPECT_EQ(e7.num_keys(), 2);
  EXPECT_EQ(e70->num_keys(), 1);
  EXPECT_THROW(PrefixStore("", base), CommError);
}

// --- TCP-only behaviour --------------------------------------------------------------------

TEST(TCPStore, OneConnectionHoldsManyConcurrentWaits) {
  TCPStoreServer server;
  TCPStore waiter("127.0.0.1", server.port(), 30s);
  TCPStore writer("127.0.0.1", server.port(), 30s);
  constexpr int kWaits = 64;
  std::vector<std::string> got(kWaits);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaits; ++i)
    threads.emplace_back([&, i] { got[i] = waiter.get_string("w/" + std::to_string(i)); });
  // All 64 are parked on the server at once, over the waiter's single connection.
  ASSERT_TRUE(eventually([&] { return server.stats().waits_parked == kWaits; }))
      << server.stats().waits_parked;
  EXPECT_EQ(server.stats().connections_open, 2u);
  // The pipeline is not blocked by them: other requests on the same connection proceed.
  waiter.set_string("meanwhile", "ok");
  EXPECT_EQ(waiter.get_string("meanwhile"), "ok");
  for (int i = kWaits - 1; i >= 0; --i)
    writer.set_string("w/" + std::to_string(i), std::to_string(i * i));
  for (auto& t : threads) t.join();
  for (int i = 0; i < kWaits; ++i) EXPECT_EQ(got[i], std::to_string(i * i));
  EXPECT_EQ(server.stats().waits_parked, 0u);
}

// A barrier: many connections parked on one key are all released by the set that makes it,
// while a wait that also needs another key stays parked until that key comes.
TEST(TCPStoreServer, ManyWaitersOfOneKeyAreReleasedTogether) {
  TCPStoreServer server;
  constexpr int kWaiters = 200;
  std::vector<std::unique_ptr<RawClient>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_TRUE(waiters.back()->send(
        request(uint64_t(i), Op::kWait).strings({"barrier"}).i64(60'000).finish()));
  }
  RawClient both(server.port());
  ASSERT_TRUE(both.send(request(7, Op::kWait).strings({"barrier", "other"}).i64(60'000).finish()));
  ASSERT_TRUE(eventually([&] { return server.stats().waits_parked == kWaiters + 1; }))
      << server.stats().waits_parked;
  EXPECT_EQ(server.stats().connections_open_peak, uint64_t(kWaiters + 1));

  TCPStore writer("127.0.0.1", server.port(), 30s);
  writer.set_string("barrier", "open");
  for (int i = 0; i < kWaiters; ++i) {
    auto reply = waiters[size_t(i)]->recv_frame();
    ASSERT_TRUE(reply) << "waiter " << i << " was not released";
    comm::wire::Reader r(reply->data(), reply->size());
    EXPECT_EQ(r.u64(), uint64_t(i));
    EXPECT_EQ(r.u8(), uint8_t(comm::wire::Status::kOk));
  }
  ASSERT_TRUE(eventually([&] { return server.stats().waits_parked == 1; }));
  writer.set_string("barrier", "again");  // notifies the remaining waiter, still not ready
  writer.set_string("other", "here");
  auto reply = both.recv_frame();
  ASSERT_TRUE(reply);
  EXPECT_EQ((*reply)[8], uint8_t(comm::wire::Status::kOk));
  EXPECT_EQ(server.stats().waits_parked, 0u);
}

TEST(TCPStore, ConnectRetriesUntilTheServerStarts) {
  uint16_t port;
  {
    TCPStoreServer probe;  // find a free port, then free it
    port = probe.port();
  }
  std::unique_ptr<TCPStore> client;
  std::exception_ptr err;
  std::thread t([&] {
    try {
      client = std::make_unique<TCPStore>("127.0.0.1", port, 20s);
    } catch (...) {
      err = std::current_exception();
    }
  });
  std::this_thread::sleep_for(200ms);  // the client's first attempts are refused
  TCPStoreServer server(TCPStoreServerOptions{.port = port});
  t.join();
  ASSERT_FALSE(err);
  client->set_string("k", "v");
  EXPECT_EQ(client->get_string("k"), "v");
}

TEST(TCPStore, ConnectingToNothingTimesOut) {
  uint16_t port;
  {
    TCPStoreServer probe;
    port = probe.port();
  }
  EXPECT_THROW(TCPStore("127.0.0.1", port, 300ms), TimeoutError);
  EXPECT_THROW(TCPStore("no-such-host.invalid", port, 300ms), CommError);
}

TEST(TCPStore, StoppingTheServerFailsBlockedAndLaterCalls) {
  auto server = std::make_unique<TCPStoreServer>();
  TCPStore client("127.0.0.1", server->port(), 60s);
  std::exception_ptr err;
  std::thread t([&] {
    try {
      client.get("never");
    } catch (...) {
      err = std::current_exception();
    }
  });
  ASSERT_TRUE(eventually([&] { return server->stats().waits_parked == 1; }));
  server->stop();
  t.join();
  ASSERT_TRUE(err);
  try {
    std::rethrow_exception(err);
  } catch (const TimeoutError&) {
    FAIL() << "a lost server must read as a broken connection, not a timeout";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("connection"), std::string::npos) << e.what();
  }
  EXPECT_THROW(client.set_string("k", "v"), CommError);
}

TEST(TCPStoreServer, PortZeroPicksDistinctFreePorts) {
  TCPStoreServer a, b;
  EXPECT_NE(a.port(), 0);
  EXPECT_NE(b.port(), 0);
  EXPECT_NE(a.port(), b.port());
  TCPStoreServerOptions taken;
  taken.port = a.port();
  EXPECT_THROW(TCPStoreServer{taken}, CommError);
}

TEST(TCPStoreServer, ClientsVanishingMidRequestDoNotHurtOthers) {
  TCPStoreServer server;
  TCPStore good("127.0.0.1", server.port(), 30s);
  std::string good_got;
  std::thread good_wait([&] { good_got = good.get_string("released-later"); });
  ASSERT_TRUE(eventually([&] { return server.stats().waits_parked == 1; }));

  {  // Half a frame, then gone.
    RawClient raw(server.port());
    Bytes frame = request(1, Op::kSet).str("half").bytes(Bytes(1000, 1)).i64(0).finish();
    frame.resize(frame.size() / 2);
    ASSERT_TRUE(raw.send(frame));
  }
  {  // A parked wait, then gone.
    RawClient raw(server.port());
    ASSERT_TRUE(raw.send(request(2, Op::kWait).strings({"never"}).i64(600'000).finish()));
    ASSERT_TRUE(eventually([&] { return server.stats().waits_parked == 2; }));
  }
  {  // Requests it never reads the replies of, then gone.
    RawClient raw(server.port());
    for (int i = 0; i < 100; ++i) raw.send(request(3 + i, Op::kNumKeys).str("").finish());
  }
  // A process killed with -9 while parked in a wait (the kernel closes its socket).
  Bytes park = request(7, Op::kGet).str("never2").i64(600'000).finish();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // only raw syscalls here: the parent has threads
    RawClient raw(server.port());
    raw.send(park);
    for (;;) ::pause();
  }
  ASSERT_TRUE(eventually(
      [&] { return server.stats().waits_parked == 2 || server.stats().waits_parked == 3; }));
  ASSERT_TRUE(eventually([&] { return server.stats().waits_parked == 2; }) ||
              eventually([&] { return server.stats().waits_parked == 3; }));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);

  // Every vanished client is cleaned up: one connection and one parked wait left (good's).
  ASSERT_TRUE(eventually([&] {
    auto s = server.stats();
    return s.connections_open == 1 && s.waits_parked == 1;
  })) << "open="
      << server.stats().connections_open << " parked=" << server.stats().waits_parked;
  EXPECT_EQ(server.stats().dropped_malformed, 0u) << "leaving is not a protocol error";
  TCPStore other("127.0.0.1", server.port(), 10s);
  other.set_string("released-later", "fine");
  good_wait.join();
  EXPECT_EQ(good_got, "fine");
  EXPECT_EQ(good.add("still-works", 1), 1);
}

// --- Per-client bounds and malformed frames -------------------------------------------------

TCPStoreServerOptions small_limits() {
  TCPStoreServerOptions o;
  o.max_client_bytes = 64 << 10;
  o.max_value_bytes = 16 << 10;
  return o;
}

TEST(TCPStoreServer, OversizedFrameClosesOnlyThatConnection) {
  TCPStoreServer server(small_limits());
  TCPStore good("127.0.0.1", server.port(), 10s);
  RawClient raw(server.port());
  uint8_t header[4] = {0, 0, 16, 0};  // 1 MiB announced
  ASSERT_TRUE(raw.send(Bytes(header, header + 4)));
  EXPECT_TRUE(raw.closed_by_peer());
  EXPECT_EQ(server.stats().dropped_malformed, 1u);
  good.set_string("k", "v");
  EXPECT_EQ(good.get_string("k"), "v");
}

TEST(TCPStoreServer, ClientThatDoesNotReadItsRepliesIsCutOff) {
  TCPStoreServer server(small_limits());
  TCPStore good("127.0.0.1", server.port(), 10s);
  good.set("big", Bytes(16 << 10, 9));
  RawClient flood(server.port());
  // 4000 gets of a 16 KiB value: 64 MB of replies, far past what socket buffers absorb.
  Bytes frames;
  for (int i = 0; i < 4000; ++i) {
    Bytes f = request(i, Op::kGet).str("big").i64(1000).finish();
    frames.insert(frames.end(), f.begin(), f.end());
  }
  flood.send(frames);  // may fail part-way once the server has cut it off
  ASSERT_TRUE(eventually([&] { return server.stats().dropped_over_limit == 1; }));
  EXPECT_TRUE(flood.closed_by_peer());
  EXPECT_EQ(good.get("big").size(), size_t(16 << 10));
}

TEST(TCPStoreServer, TooManyParkedWaitsAreCutOff) {
  TCPStoreServer server(small_limits());
  TCPStore good("127.0.0.1", server.port(), 10s);
  RawClient raw(server.port());
  // 100 waits on 1 KiB keys hold ~130 KiB of the server's memory: over the 64 KiB bound.
  for (int i = 0; i < 100; ++i)
    if (!raw.send(request(i, Op::kWait)
                      .strings({std::string(1000, 'k') + std::to_string(i)})
                      .i64(600'000)
                      .finish()))
      break;
  EXPECT_TRUE(raw.closed_by_peer());
  EXPECT_EQ(server.stats().dropped_over_limit, 1u);
  EXPECT_TRUE(eventually([&] { return server.stats().waits_parked == 0; }));
  EXPECT_EQ(good.add("n", 1), 1);
}

TEST(TCPStoreServer, MalformedFramesCloseOnlyTheirConnection) {
  TCPStoreServer server;
  TCPStore good("127.0.0.1", server.port(), 30s);
  std::string good_got;
  std::thread good_wait([&] { good_got = good.get_string("after-the-garbage"); });
  ASSERT_TRUE(eventually([&] { return server.stats().waits_parked == 1; }));

  auto with_length = [](Bytes body) {
    comm::wire::Writer w;
    Bytes f = std::move(w).finish();  // just the zeroed length prefix
    f.insert(f.end(), body.begin(), body.end());
    uint32_t n = static_cast<uint32_t>(body.size());
    for (int i = 0; i < 4; ++i) f[i] = static_cast<uint8_t>(n >> (8 * i));
    return f;
  };
  std::vector<std::pair<std::string, Bytes>> bad = {
      {"op code 0", request(1, static_cast<Op>(0)).finish()},
      {"op code 200", request(1, static_cast<Op>(200)).finish()},
      {"body shorter than id+op", with_length({1, 2, 3})},
      {"trailing bytes", request(1, Op::kPing).u8(0).finish()},
      {"key length past the end", request(1, Op::kSet).u32(1000).u8('k').finish()},
      {"list count past the end", request(1, Op::kCheck).u32(0xFFFFFFFF).finish()},
      {"multi_set count past the end", request(1, Op::kMultiSet).u32(1 << 30).finish()},
      {"missing timeout", request(1, Op::kGet).str("k").finish()},
  };
  for (const auto& [what, frame] : bad) {
    RawClient raw(server.port());
    raw.send(request(100, Op::kPing).finish());  // answered: the connection starts healthy
    auto pong = raw.recv_frame();
    ASSERT_TRUE(pong) << what;
    raw.send(frame);
    EXPECT_TRUE(raw.closed_by_peer()) << what;
  }
  EXPECT_EQ(server.stats().dropped_malformed, bad.size());
  good.set_string("after-the-garbage", "served");
  good_wait.join();
  EXPECT_EQ(good_got, "served");
}

// --- `weft store` ----------------------------------------------------------------------------

// weft run's agents race to host a multi-node job's store: the losers learn that the port
// is taken (not some other bind failure) and connect instead.
TEST(TCPStoreServer, TakenPortIsAddressInUse) {
  comm::TCPStoreServer first;
  comm::TCPStoreServerOptions o;
  o.port = first.port();
  EXPECT_THROW(comm::TCPStoreServer second(o), comm::AddressInUseError);
  o.host = "not a host name";
  o.port = 0;
  o.insecure = true;
  try {
    comm::TCPStoreServer bad(o);
    ADD_FAILURE() << "bound to a malformed host";
  } catch (const comm::AddressInUseError&) {
    ADD_FAILURE() << "a malformed host is not a taken port";
  } catch (const CommError&) {
  }
}

TEST(WeftStoreCommand, ServesUntilSigterm) {
  ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with every test binary";
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    ::execl(WEFT_BINARY, WEFT_BINARY, "store", "--port", "0", "--host", "127.0.0.1",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  std::string line;
  char c;
  while (line.find('\n') == std::string::npos && ::read(out[0], &c, 1) == 1) line += c;
  ::close(out[0]);
  const std::string prefix = "weft store: listening on 127.0.0.1:";
  ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
  uint16_t port = static_cast<uint16_t>(std::stoi(line.substr(prefix.size())));
  {
    TCPStore client("127.0.0.1", port, 10s);
    client.set_string("k", "from the command");
    EXPECT_EQ(client.get_string("k"), "from the command");
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(WeftStoreCommand, BadPortIsBadInput) {
  ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with every test binary";
  for (const char* port : {"70000", "-1", "http"}) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, STDERR_FILENO);
      ::execl(WEFT_BINARY, WEFT_BINARY, "store", "--port", port, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << port << ": status " << status;
  }
}

}  // namespace
}  // namespace weft::test
