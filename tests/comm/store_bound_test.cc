// Keys bound to a client's connection (SetOptions::bind): gone after the server's grace when
// the client's process is killed, at once when it says goodbye, kept when it rebinds them in
// the grace; the table's rules underneath; the stores that cannot bind say so. Real
// processes (run_ranks) where a death matters; every wait is a hang guard, never a timing
// expectation: a grace that must not run out in a test is a minute long.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/elastic/heartbeat.h"
#include "comm/elastic/rendezvous.h"
#include "comm/store/client_process.h"
#include "comm/store/in_memory_store.h"
#include "comm/store/kv_table.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "tests/comm/killable_client.h"
#include "tests/comm/store_raw_client.h"
#include "tests/support/eventually.h"
#include "tests/support/multiprocess.h"
#include "tests/support/run_weft.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::Bytes;
using comm::KvTable;
using comm::Millis;
using comm::SetOptions;
using comm::TCPStore;
using comm::TCPStoreServer;
using comm::TCPStoreServerOptions;
using comm::to_bytes;
using comm::wire::Op;
using Clock = std::chrono::steady_clock;

// A grace that cannot run out while a test looks.
constexpr Millis kLongGrace{600'000};

const SetOptions kBound{.bind = true};

TCPStoreServerOptions with_grace(Millis grace) {
  TCPStoreServerOptions o;
  o.bound_key_grace = grace;
  return o;
}

// A client that binds a key and then vanishes without a goodbye, as a killed process's
// kernel closes its socket: the wire protocol by hand, then close().
void bind_and_vanish(uint16_t port, const std::string& key) {
  RawClient raw(port);
  ASSERT_TRUE(raw.send(request(1, Op::kSetBound).str(key).bytes(to_bytes("v")).i64(0).finish()));
  auto reply = raw.recv_frame();
  ASSERT_TRUE(reply.has_value());
  comm::wire::Reader r(reply->data(), reply->size());
  EXPECT_EQ(r.u64(), 1u);
  EXPECT_EQ(r.u8(), uint8_t(comm::wire::Status::kOk));
  raw.close();
}

// --- The table -----------------------------------------------------------------------------

TEST(KvTableBound, ReleaseDropsOnlyTheOwnersKeysAndAddKeepsTheBinding) {
  KvTable t(1 << 20);
  t.set("a", to_bytes("1"), std::nullopt, 7);
  t.set("b", to_bytes("1"), std::nullopt, 7);
  t.set("c", to_bytes("1"), std::nullopt, 8);
  t.set("plain", to_bytes("1"), std::nullopt);
  EXPECT_EQ(t.add("a", 1), 2);  // keeps the binding, as it keeps a TTL
  bool wrote = false;
  t.compare_set("a", to_bytes("2"), to_bytes("3"), &wrote);
  EXPECT_TRUE(wrote);
  t.append("a", to_bytes("x"));
  t.set("b", to_bytes("2"), std::nullopt);  // a plain set unbinds
  EXPECT_EQ(t.bound_to(7), 1u);
  EXPECT_EQ(t.release(7, Millis(0)), 1u);
  EXPECT_EQ(t.find("a"), nullptr);
  EXPECT_NE(t.find("b"), nullptr);
  EXPECT_NE(t.find("c"), nullptr);
  EXPECT_NE(t.find("plain"), nullptr);
  EXPECT_EQ(t.release(7, Millis(0)), 0u);
  EXPECT_EQ(t.bound_to(8), 1u);
}

TEST(KvTableBound, ReleasedKeyExpiresAfterTheGraceUnlessSetAgain) {
  KvTable t(1 << 20);
  t.set("gone", to_bytes("1"), std::nullopt, 1);
  t.set("kept", to_bytes("1"), std::nullopt, 1);
  t.set("ttl", to_bytes("1"), Millis(1), 1);  // its TTL comes before any grace
  EXPECT_EQ(t.release(1, Millis(50)), 3u);
  EXPECT_NE(t.find("gone"), nullptr) << "within the grace";
  t.set("kept", to_bytes("2"), std::nullopt, 2);  // rebound by a new connection in the grace
  ASSERT_TRUE(eventually([&] { return t.find("gone") == nullptr; }));
  EXPECT_EQ(t.find("ttl"), nullptr);
  ASSERT_NE(t.find("kept"), nullptr);
  EXPECT_EQ(comm::to_string(*t.find("kept")), "2");
  EXPECT_EQ(t.bound_to(2), 1u);
  EXPECT_EQ(t.bytes(), std::string("kept").size() + 1);
}

// The end of a grace cut short (the client's process exited): every key release() unbound
// and nobody touched since goes, including one whose own TTL ends before the grace (an
// alive key: 2 s against a 30 s grace), which release() leaves at its TTL. A key set again
// since stays. (drop_released compared each key with the grace's end only, and kept the
// alive key: NodeLoss.AKilledAgent... then waited for the TTL in 1 run of 3.)
TEST(KvTableBound, DropReleasedEndsTheGraceOfKeysWithTheirOwnSoonerTtlToo) {
  KvTable t(1 << 20);
  t.set("plain", to_bytes("1"), std::nullopt, 1);
  t.set("alive", to_bytes("1"), Millis(60'000), 1);  // its TTL, sooner than the grace
  t.set("again", to_bytes("1"), std::nullopt, 1);
  std::vector<KvTable::Released> released;
  KvTable::Clock::time_point at;
  EXPECT_EQ(t.release(1, Millis(600'000), &released, &at), 3u);
  ASSERT_EQ(released.size(), 3u);
  t.set("again", to_bytes("2"), std::nullopt);  // set since: not as release left it
  EXPECT_EQ(t.drop_released(released), 2u);
  EXPECT_EQ(t.find("plain"), nullptr);
  EXPECT_EQ(t.find("alive"), nullptr);
  ASSERT_NE(t.find("again"), nullptr);
  EXPECT_EQ(comm::to_string(*t.find("again")), "2");
}

TEST(KvTableBound, EraseAndExpiryForgetTheBinding) {
  KvTable t(1 << 20);
  t.set("e", to_bytes("1"), std::nullopt, 3);
  t.set("x", to_bytes("1"), Millis(1), 3);
  EXPECT_TRUE(t.erase("e"));
  ASSERT_TRUE(eventually([&] { return t.find("x") == nullptr; }));
  EXPECT_EQ(t.bound_to(3), 0u);
  t.set("e", to_bytes("again"), std::nullopt);  // an unbound key of the same name stays
  EXPECT_EQ(t.release(3, Millis(0)), 0u);
  EXPECT_NE(t.find("e"), nullptr);
}

// --- Stores that cannot bind -----------------------------------------------------------------

TEST(StoreBound, StoresWithoutAConnectionRefuseToBindInsteadOfIgnoringIt) {
  comm::InMemoryStore memory;
  EXPECT_FALSE(memory.binds_to_connection());
  EXPECT_THROW(memory.set("k", to_bytes("v"), kBound), NotSupported);
  EXPECT_FALSE(memory.check({"k"})) << "nothing was written";
  memory.set("k", to_bytes("v"), SetOptions{.ttl = Millis(60'000)});  // without bind: a set
  EXPECT_TRUE(memory.check({"k"}));
  // A heartbeat over it stays a plain TTL key, and says so.
  comm::Heartbeat hb(memory, "alive/n", 50ms, 5s, "beat/n");
  EXPECT_FALSE(hb.bound());
  hb.start();
  EXPECT_TRUE(memory.check({"alive/n"}));
  EXPECT_FALSE(memory.check({"beat/n"}));
  hb.stop_and_erase();
}

TEST(StoreBound, TcpClientAndPrefixStoreBindAndOldClientsIgnoreTheNewHelloFlag) {
  TCPStoreServer server(with_grace(kLongGrace));
  auto tcp = std::make_shared<TCPStore>("127.0.0.1", server.port(), 10s);
  EXPECT_TRUE(tcp->binds_to_connection());
  comm::PrefixStore prefixed("epoch/3", tcp);
  EXPECT_TRUE(prefixed.binds_to_connection());
  prefixed.set("alive", to_bytes("v"), kBound);
  // A client that knows nothing of bound keys (the RawClient reads the hello's flags and
  // ignores them, as clients before this flag did) still works and sees the key.
  RawClient old(server.port());
  ASSERT_TRUE(old.send(request(5, Op::kCheck).strings({"epoch/3/alive"}).finish()));
  auto reply = old.recv_frame();
  ASSERT_TRUE(reply.has_value());
  comm::wire::Reader r(reply->data(), reply->size());
  EXPECT_EQ(r.u64(), 5u);
  EXPECT_EQ(r.u8(), uint8_t(comm::wire::Status::kOk));
  EXPECT_EQ(r.u8(), 1) << "the bound key exists, under the prefix";
}

// A store server from before bound keys, by hand: its hello has no kHelloBindsKeys; it answers
// every request kOk and records the ops it got, until the client closes.
class OldServer {
 public:
  OldServer() {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_, 1);
    socklen_t n = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &n);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~OldServer() {
    ::shutdown(listen_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    ::close(listen_);
  }
  uint16_t port() const { return port_; }
  // The ops received, once the client has closed (joins the serving thread).
  std::vector<Op> ops() {
    if (thread_.joinable()) thread_.join();
    return ops_;
  }

 private:
  static bool read_all(int fd, uint8_t* p, size_t n) {
    for (size_t off = 0; off < n;) {
      ssize_t r = ::recv(fd, p + off, n - off, 0);
      if (r <= 0) return false;
      off += size_t(r);
    }
    return true;
  }
  static std::optional<Bytes> frame(int fd) {
    uint8_t len[4];
    if (!read_all(fd, len, 4)) return std::nullopt;
    Bytes body(comm::wire::decode_length(len));
    if (!read_all(fd, body.data(), body.size())) return std::nullopt;
    return body;
  }
  static void send_all(int fd, const Bytes& b) { ::send(fd, b.data(), b.size(), MSG_NOSIGNAL); }
  void serve() {
    int fd = ::accept(listen_, nullptr, nullptr);
    if (fd < 0) return;
    timeval guard{20, 0};  // a hang guard: a client that never closes ends the test
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &guard, sizeof guard);
    comm::wire::Writer hello;
    hello.u8(comm::wire::kHandshakeVersion).u8(0).bytes(Bytes(32, 7));
    send_all(fd, hello.finish());
    if (frame(fd)) {  // the proof
      comm::wire::Writer ok;
      ok.u8(uint8_t(comm::wire::Status::kOk));
      send_all(fd, ok.finish());
      while (auto body = frame(fd)) {
        comm::wire::Reader r(body->data(), body->size());
        uint64_t id = r.u64();
        ops_.push_back(Op(r.u8()));
        comm::wire::Writer reply;
        reply.u64(id).u8(uint8_t(comm::wire::Status::kOk));
        send_all(fd, reply.finish());
      }
    }
    ::close(fd);
  }
  int listen_ = -1;
  uint16_t port_ = 0;
  std::vector<Op> ops_;
  std::thread thread_;
};

// A new client against an older server: it knows from the hello that the server cannot bind,
// so binding throws NotSupported (nothing is sent) and its destructor sends no goodbye, an op
// the older server would close the connection for.
TEST(StoreBound, NewClientOfAnOlderServerNeitherBindsNorSaysGoodbye) {
  OldServer old;
  {
    TCPStore client("127.0.0.1", old.port(), 10s);
    EXPECT_FALSE(client.binds_to_connection());
    EXPECT_THROW(client.set("k", to_bytes("v"), kBound), NotSupported);
    // Nor does it wait for a key to go (kWaitGone, newer still): refused, nothing sent.
    EXPECT_FALSE(client.waits_for_absence());
    EXPECT_THROW(client.wait_gone({"k"}, 10ms), NotSupported);
    client.set("k", to_bytes("v"), SetOptions{.ttl = Millis(1000)});  // a plain set works
  }
  EXPECT_EQ(old.ops(), (std::vector<Op>{Op::kPing, Op::kSet}));
}

// --- One server, clients in this process -------------------------------------------------------

// Goodbye: TCPStore's destructor says it, and its bound keys go at once (the grace is a
// minute here, so only the goodbye can have dropped them); unbound keys and TTL keys stay.
TEST(StoreBound, CleanCloseDropsBoundKeysAtOnceAndKeepsTheOthers) {
  TCPStoreServer server(with_grace(kLongGrace));
  TCPStore reader("127.0.0.1", server.port(), 10s);
  {
    TCPStore client("127.0.0.1", server.port(), 10s);
    client.set("bound", to_bytes("v"), kBound);
    client.set("bound-ttl", to_bytes("v"), SetOptions{.ttl = Millis(600'000), .bind = true});
    client.set("plain", to_bytes("v"));
    client.set("ttl", to_bytes("v"), Millis(600'000));
    EXPECT_TRUE(reader.check({"bound", "bound-ttl", "plain", "ttl"}));
  }  // goodbye, acknowledged before the destructor returns
  EXPECT_FALSE(reader.check({"bound"}));
  EXPECT_FALSE(reader.check({"bound-ttl"}));
  EXPECT_TRUE(reader.check({"plain", "ttl"}));
  EXPECT_EQ(server.stats().goodbyes, 1u);
  EXPECT_EQ(server.stats().bound_keys_released, 2u);
  EXPECT_EQ(server.stats().dropped_malformed, 0u);
}

// Without a goodbye the key outlives the connection by the grace: with a minute's grace it
// is still there once the server has seen the close; with none it goes with the close.
TEST(StoreBound, AbruptCloseKeepsTheKeyForTheGraceThenDropsIt) {
  {
    TCPStoreServer server(with_grace(kLongGrace));
    TCPStore reader("127.0.0.1", server.port(), 10s);
    bind_and_vanish(server.port(), "k");
    ASSERT_TRUE(eventually([&] { return server.stats().bound_keys_released == 1; }));
    EXPECT_TRUE(reader.check({"k"})) << "dropped before its grace";
  }
  {
    TCPStoreServer server(with_grace(Millis(0)));
    TCPStore reader("127.0.0.1", server.port(), 10s);
    bind_and_vanish(server.port(), "k");
    ASSERT_TRUE(eventually([&] { return !reader.check({"k"}); }));
    EXPECT_EQ(server.stats().goodbyes, 0u);
  }
  {  // The default grace runs out by itself (the expiry timer, no request needed).
    TCPStoreServer server;
    bind_and_vanish(server.port(), "k");
    TCPStore reader("127.0.0.1", server.port(), 10s);
    ASSERT_TRUE(eventually([&] { return !reader.check({"k"}); }));
  }
}

// A client that reconnects within the grace and binds the key again keeps it: the key is
// then its new connection's (its goodbye drops it), not the old one's (whose grace passes).
TEST(StoreBound, KeySetAgainByAReconnectWithinTheGraceSurvives) {
  TCPStoreServer server(with_grace(Millis(300)));
  TCPStore reader("127.0.0.1", server.port(), 10s);
  // The new connection is made before the old one breaks, so that its connect does not eat
  // into the grace. Should the rebind still come after the grace (a stalled machine), the
  // key is created again rather than kept, and the test checks the same: that the old
  // connection's pending expiry never drops the key its new connection holds.
  RawClient old(server.port());
  ASSERT_TRUE(old.send(request(1, Op::kSetBound).str("k").bytes(to_bytes("old")).i64(0).finish()));
  ASSERT_TRUE(old.recv_frame().has_value());
  {
    TCPStore again("127.0.0.1", server.port(), 10s);
    old.close();  // the old connection breaks ...
    ASSERT_TRUE(eventually([&] { return server.stats().bound_keys_released == 1; }));
    again.set("k", to_bytes("new"), kBound);  // ... and the reconnect rebinds it in the grace
    std::this_thread::sleep_for(600ms);       // past the old grace: whether it passed is not timed
    ASSERT_TRUE(reader.check({"k"})) << "a rebound key went with the old connection";
    EXPECT_EQ(reader.get_string("k"), "new");
  }  // the new connection's goodbye
  EXPECT_FALSE(reader.check({"k"}));
}

// A bound key with a TTL still expires by it while its connection lives: the fallback for a
// host that vanishes without closing its connection.
TEST(StoreBound, BoundKeyStillExpiresByItsTtlWhileTheConnectionLives) {
  TCPStoreServer server(with_grace(kLongGrace));
  TCPStore client("127.0.0.1", server.port(), 10s);
  client.set("k", to_bytes("v"), SetOptions{.ttl = Millis(50), .bind = true});
  client.set("forever", to_bytes("v"), kBound);
  ASSERT_TRUE(eventually([&] { return !client.check({"k"}); }));
  EXPECT_TRUE(client.check({"forever"})) << "a live connection's bound key stays";
}

// --- Processes -------------------------------------------------------------------------------

// A process that binds a key and is SIGKILLed: the key goes (its kernel closed the socket),
// a waiter then finds it absent, and the keys it set unbound stay.
TEST(StoreBoundProcesses, KeyOfASigkilledClientGoesAndItsUnboundKeysStay) {
  RunOptions run;
  run.deadline = 60s;
  run.store_timeout = 10s;
  RunResult result = run_ranks(2, [](RankContext& ctx) {
    auto store = ctx.store();
    if (ctx.rank() == 1) {
      store->set("alive/1", to_bytes("v"), kBound);
      store->set("plain/1", to_bytes("v"));
      store->set("ttl/1", to_bytes("v"), Millis(600'000));
      store->set_string("ready", "1");
      store->wait({"kill"}, 30s);
      ::raise(SIGKILL);
    }
    store->wait({"ready"}, 30s);
    EXPECT_TRUE(store->check({"alive/1"})) << "the key stays while its client lives";
    store->set_string("kill", "1");
    const auto t0 = Clock::now();
    ASSERT_TRUE(eventually([&] { return !store->check({"alive/1"}); }));
    std::printf("[ measure ] SIGKILL -> bound key gone: %.0f ms (grace 250 ms)\n",
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    EXPECT_TRUE(store->check({"plain/1", "ttl/1"}));
    EXPECT_THROW(store->wait({"alive/1"}, 100ms), TimeoutError) << "a waiter sees it absent";
    store->set_timeout(100ms);
    EXPECT_THROW(store->get("alive/1"), TimeoutError);
  });
  ASSERT_EQ(result.ranks.size(), 2u);
  EXPECT_EQ(result.ranks[0].status, RankStatus::kOk) << result.ranks[0].message;
  EXPECT_EQ(result.ranks[1].status, RankStatus::kSignaled) << result.summary();
}

// A client process on the server's machine says which process it is (kOwner, before its
// first bound key): once it is SIGKILLed its bound keys go although the grace is ten minutes
// (a process that has exited never reconnects), counted as dropped at its exit; its unbound
// keys stay. Forked before the server starts, so the child copies no running thread.
TEST(StoreBoundProcesses, KeysOfAnExitedClientProcessGoWithoutWaitingOutTheGrace) {
  KillableClient child([](TCPStore& client) {
    client.set("bound", to_bytes("v"), kBound);
    client.set("bound-ttl", to_bytes("v"), SetOptions{.ttl = Millis(600'000), .bind = true});
    client.set("plain", to_bytes("v"));
  });
  TCPStoreServer server(with_grace(kLongGrace));
  ASSERT_TRUE(child.start(server.port())) << "the client process did not bind its keys";
  TCPStore reader("127.0.0.1", server.port(), 10s);
  EXPECT_TRUE(reader.check({"bound", "bound-ttl", "plain"}));
  EXPECT_TRUE(child.kill_and_reap());
  ASSERT_TRUE(eventually([&] { return !reader.check({"bound"}) && !reader.check({"bound-ttl"}); }))
      << "the keys of an exited process waited for the ten-minute grace";
  EXPECT_TRUE(reader.check({"plain"}));
  EXPECT_EQ(server.stats().bound_keys_released, 2u);
  EXPECT_EQ(server.stats().bound_keys_dropped_at_exit, 2u);
  EXPECT_EQ(server.stats().goodbyes, 0u);
}

// The other side: a connection that closes while its process lives (this one: a broken
// connection whose client may reconnect) keeps its keys for the grace, and an identity that
// is not a live process of this namespace (a start time that does not match) is not watched.
TEST(StoreBound, ClosedConnectionOfALiveProcessKeepsItsKeysForTheGrace) {
  TCPStoreServer server(with_grace(kLongGrace));
  TCPStore reader("127.0.0.1", server.port(), 10s);
  const std::optional<comm::ClientProcess> me = comm::this_client_process();
  ASSERT_TRUE(me.has_value());
  auto owner = [](uint64_t id, const comm::ClientProcess& p) {
    return request(id, Op::kOwner)
        .i64(p.pid)
        .u64(p.pid_ns_dev)
        .u64(p.pid_ns_ino)
        .u64(p.start_ticks)
        .finish();
  };
  auto watched = [](const std::optional<Bytes>& reply) {
    comm::wire::Reader r(reply->data(), reply->size());
    r.u64();
    EXPECT_EQ(r.u8(), uint8_t(comm::wire::Status::kOk));
    return r.u8() == 1;
  };
  {
    RawClient raw(server.port());
    ASSERT_TRUE(raw.send(owner(1, *me)));
    auto reply = raw.recv_frame();
    ASSERT_TRUE(reply.has_value());
    EXPECT_TRUE(watched(reply)) << "this process, on the server's machine, is watched";
    ASSERT_TRUE(raw.send(request(2, Op::kSetBound).str("k").bytes(to_bytes("v")).i64(0).finish()));
    ASSERT_TRUE(raw.recv_frame().has_value());
    comm::ClientProcess other = *me;
    other.start_ticks += 1;  // the same pid, a different (later) process
    ASSERT_TRUE(raw.send(owner(3, other)));
    reply = raw.recv_frame();
    ASSERT_TRUE(reply.has_value());
    EXPECT_FALSE(watched(reply)) << "a pid whose start time differs is another process";
    raw.close();
  }
  ASSERT_TRUE(eventually([&] { return server.stats().bound_keys_released == 1; }));
  EXPECT_TRUE(reader.check({"k"})) << "a live process's key went before its grace";
  EXPECT_EQ(server.stats().bound_keys_dropped_at_exit, 0u);
}

// Rendezvous over it: a SIGKILLed member is re-formed away and named lost by its closed
// connection. heartbeat_timeout is 30 s, and lost_cause tells the two paths apart by the
// witness key, so a test that passed by the TTL would fail on the cause.
TEST(StoreBoundProcesses, RendezvousNamesAKilledNodeLostByItsClosedConnection) {
  RunOptions run;
  run.deadline = 90s;
  run.store_timeout = 10s;
  RunResult result = run_ranks(3, [](RankContext& ctx) {
    auto store = ctx.store();
    comm::RendezvousOptions o;
    o.run_id = "job";
    o.node_id = "node" + std::to_string(ctx.rank());
    o.min_nodes = 2;
    o.max_nodes = 3;
    o.heartbeat_interval = 1s;
    o.heartbeat_timeout = 30s;
    o.poll_interval = 20ms;
    o.last_call = 5s;
    o.join_timeout = 60s;
    comm::Rendezvous r(*store, o);
    EXPECT_TRUE(r.heartbeat().bound());
    comm::Membership m1 = r.join();
    EXPECT_EQ(m1.world(), 3);
    store->add("joined", 1);
    if (ctx.rank() == 2) {
      store->wait({"kill"}, 30s);
      ::raise(SIGKILL);
    }
    while (store->add("joined", 0) < 3) std::this_thread::sleep_for(10ms);
    const auto t0 = Clock::now();
    if (ctx.rank() == 0) {
      EXPECT_EQ(r.lost_cause("node2"), "alive");
      store->set_string("kill", "1");
    }
    auto m2 = r.watch(60s);
    ASSERT_TRUE(m2.has_value()) << "no new epoch";
    std::printf("[ measure ] node%d: kill asked -> epoch %lld: %.0f ms\n", ctx.rank(),
                (long long)m2->epoch,
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    EXPECT_EQ(m2->world(), 2);
    EXPECT_EQ(r.lost_cause("node2").rfind("its store connection closed", 0), 0u)
        << r.lost_cause("node2");
  });
  ASSERT_EQ(result.ranks.size(), 3u);
  EXPECT_EQ(result.ranks[2].status, RankStatus::kSignaled) << result.summary();
  for (int r : {0, 1})
    EXPECT_EQ(result.ranks[r].status, RankStatus::kOk) << result.ranks[r].message;
}

// `weft store --bound-key-grace-ms`: a negative grace is bad input naming the flag.
TEST(WeftStoreCommand, NegativeBoundKeyGraceIsBadInputNamingTheFlag) {
  CommandResult r = run_weft("store --port 0 --bound-key-grace-ms -5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--bound-key-grace-ms"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace weft::test
