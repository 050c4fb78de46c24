// The peer check (comm/elastic/peer_check.h) against real sockets: a listener for the
// watched node, the observer's thread, an in-memory store for the keys. The watched node is
// this test process (alive: a closed connection gets the grace) or a forked child that is
// SIGKILLed (its pidfd says it is gone: reported at once). No timing thresholds: graces are
// set long where the outcome must not depend on them, and every wait is a bounded poll.
#include "comm/elastic/peer_check.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <string>

#include "base/error.h"
#include "comm/elastic/membership_record.h"
#include "comm/elastic/peer_link.h"
#include "comm/elastic/rendezvous.h"
#include "comm/store/in_memory_store.h"
#include "tests/support/eventually.h"

namespace weft::comm {
namespace {

using test::eventually;
const std::string kToken = "peer-check-test-token";

// Node "a" observes; the record lists "a" and "b" as members, and "b"'s alive key is set.
struct Fixture {
  InMemoryStore store;
  std::unique_ptr<Rendezvous> rdzv;
  Fixture() {
    RendezvousOptions o;
    o.run_id = "pc";
    o.node_id = "a";
    o.min_nodes = 1;
    o.max_nodes = 2;
    rdzv = std::make_unique<Rendezvous>(store, o);
    MembershipRecord r;
    r.version = 1;
    r.epoch = 1;
    r.members = {{"a", 0}, {"b", 1}};
    store.set(rdzv->state_key(), to_bytes(encode(r)));
    store.set(rdzv->alive_key("b"), to_bytes("1"));
  }
  void publish(const std::string& endpoint) { store.set(rdzv->peer_key("b"), to_bytes(endpoint)); }
  bool alive() { return store.check({rdzv->alive_key("b")}); }
  std::string cause() { return rdzv->lost_cause("b"); }
};

PeerCheckOptions options(Millis grace) {
  PeerCheckOptions o;
  o.token = kToken;
  o.grace = grace;
  o.refresh = Millis(50);
  return o;
}

// The watched node's listener goes (its connections close) and nothing listens there any
// more: after the grace, the observer notes why and erases b's alive key, and the
// rendezvous names that cause.
TEST(PeerCheck, ReportsANodeWhoseConnectionClosedAndDidNotComeBack) {
  Fixture f;
  auto b = std::make_unique<PeerListener>("127.0.0.1", 0, "b", kToken);
  f.publish(b->endpoint());
  std::string told;
  PeerCheckOptions o = options(Millis(200));
  o.on_lost = [&](const std::string& node, const std::string&) { told = node; };
  PeerCheck check(f.store, *f.rdzv, o);
  ASSERT_TRUE(eventually([&] { return check.watching() == 1 && b->connections() == 1; }));
  b.reset();
  ASSERT_TRUE(eventually([&] { return !f.alive(); }));
  EXPECT_EQ(check.reported(), 1u);
  EXPECT_TRUE(eventually([&] { return told == "b"; }));
  EXPECT_NE(f.cause().find("its peer connection closed"), std::string::npos) << f.cause();
  EXPECT_NE(f.cause().find("bound_key_grace 0.2 s"), std::string::npos) << f.cause();
}

// A live node whose connection broke and whose listener is back on the same address within
// the grace keeps its alive key: the observer redials and watches the new connection.
TEST(PeerCheck, ANodeThatReconnectsWithinTheGraceKeepsItsPlace) {
  Fixture f;
  auto b = std::make_unique<PeerListener>("127.0.0.1", 0, "b", kToken);
  const uint16_t port = b->port();
  f.publish(b->endpoint());
  PeerCheck check(f.store, *f.rdzv, options(Millis(60'000)));
  ASSERT_TRUE(eventually([&] { return check.watching() == 1; }));
  b.reset();  // every connection closes; the process (this one) lives
  b = std::make_unique<PeerListener>("127.0.0.1", port, "b", kToken);
  // watching() is the check's count at the end of the pass that counted the reconnect: read
  // right after reconnects() it may still be the pass before's 0 (the suite saw it once).
  ASSERT_TRUE(eventually(
      [&] { return check.reconnects() == 1 && b->connections() == 1 && check.watching() == 1; }));
  EXPECT_EQ(check.reconnects(), 1u);
  EXPECT_EQ(check.reported(), 0u);
  EXPECT_TRUE(f.alive());
  EXPECT_EQ(f.cause(), "alive");
}

// A node that left erased its own alive key: its closed connection reports nothing.
TEST(PeerCheck, ANodeWhoseAliveKeyIsGoneAlreadyIsNotReported) {
  Fixture f;
  auto b = std::make_unique<PeerListener>("127.0.0.1", 0, "b", kToken);
  f.publish(b->endpoint());
  PeerCheck check(f.store, *f.rdzv, options(Millis(0)));
  ASSERT_TRUE(eventually([&] { return check.watching() == 1; }));
  f.store.erase(f.rdzv->alive_key("b"));
  b.reset();
  ASSERT_TRUE(eventually([&] { return check.watching() == 0; }));
  EXPECT_EQ(check.reported(), 0u);
  EXPECT_FALSE(f.store.check({f.rdzv->lost_key("b")}));
}

// The watched node is another process of this machine, SIGKILLed: its pidfd says it exited,
// so it is reported at once although the grace is a minute.
TEST(PeerCheck, AKilledProcessOnThisMachineIsReportedWithoutTheGrace) {
  Fixture f;
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    PeerListener b("127.0.0.1", 0, "b", kToken);
    const uint16_t port = b.port();
    (void)!::write(out[1], &port, sizeof port);
    for (;;) ::pause();
  }
  ::close(out[1]);
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child};
  uint16_t port = 0;
  ASSERT_EQ(::read(out[0], &port, sizeof port), ssize_t(sizeof port));
  ::close(out[0]);
  f.publish("127.0.0.1:" + std::to_string(port));
  PeerCheck check(f.store, *f.rdzv, options(Millis(60'000)));
  ASSERT_TRUE(eventually([&] { return check.watching() == 1; }));
  ::kill(child, SIGKILL);
  ASSERT_TRUE(eventually([&] { return !f.alive(); }));
  EXPECT_NE(f.cause().find("its agent's process exited"), std::string::npos) << f.cause();
}

// The handshake: a wrong token is refused both ways, and a listener of another node is not
// taken for the one the observer dials.
TEST(PeerCheck, TheHandshakeRefusesAWrongTokenAndAnotherNode) {
  PeerListener b("127.0.0.1", 0, "b", kToken);
  try {
    dial_peer(b.endpoint(), "b", "wrong-token", Millis(5'000));
    FAIL() << "a wrong token was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("job token"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(eventually([&] { return b.refused() == 1; }));
  try {
    dial_peer(b.endpoint(), "c", kToken, Millis(5'000));
    FAIL() << "node b was taken for node c";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("it is node b"), std::string::npos) << e.what();
  }
  PeerLink ok = dial_peer(b.endpoint(), "b", kToken, Millis(5'000));
  EXPECT_TRUE(ok.open());
  EXPECT_EQ(ok.process.pid, ::getpid());
  EXPECT_GE(ok.pidfd, 0);  // this process, seen from itself
  EXPECT_FALSE(ok.process_gone());
}

// The listener lets go of an observer that closed its end (it holds no dead connection, and
// does not spin on one).
TEST(PeerCheck, TheListenerDropsAConnectionItsObserverClosed) {
  PeerListener b("127.0.0.1", 0, "b", kToken);
  PeerLink first = dial_peer(b.endpoint(), "b", kToken, Millis(5'000));
  PeerLink second = dial_peer(b.endpoint(), "b", kToken, Millis(5'000));
  ASSERT_TRUE(eventually([&] { return b.connections() == 2; }));
  first.close();
  EXPECT_TRUE(eventually([&] { return b.connections() == 1; }));
  EXPECT_FALSE(second.broken());
}

// A new node "c" whose address takes the connection but never answers (a listening socket
// nobody accepts on: the kernel completes the connect, and the greeting never comes) with a
// dial timeout of a minute: b's loss is reported all the same while c's dial waits, since
// dials run beside the check's loop; and stopping the check cancels c's dial.
TEST(PeerCheck, ADialThatHangsDelaysNoOtherNodesLossAndEndsWithTheCheck) {
  Fixture f;
  MembershipRecord r;
  r.version = 2;
  r.epoch = 1;
  r.members = {{"a", 0}, {"b", 1}, {"c", 2}};
  f.store.set(f.rdzv->state_key(), to_bytes(encode(r)));
  f.store.set(f.rdzv->alive_key("c"), to_bytes("1"));
  const int mute = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(mute, 0);
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_mute{mute};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(mute, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(mute, 16), 0);
  ASSERT_EQ(::getsockname(mute, reinterpret_cast<sockaddr*>(&a), &len), 0);
  f.store.set(f.rdzv->peer_key("c"), to_bytes("127.0.0.1:" + std::to_string(ntohs(a.sin_port))));

  auto b = std::make_unique<PeerListener>("127.0.0.1", 0, "b", kToken);
  f.publish(b->endpoint());
  PeerCheckOptions o = options(Millis(0));
  o.dial_timeout = Millis(60'000);  // beyond every bounded wait of this test
  auto check = std::make_unique<PeerCheck>(f.store, *f.rdzv, o);
  ASSERT_TRUE(eventually([&] { return check->watching() == 1; }));
  ASSERT_TRUE(eventually([&] {
    pollfd p{mute, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;  // c's dial connected and waits for the greeting
  }));
  b.reset();
  ASSERT_TRUE(eventually([&] { return !f.alive(); })) << "b's loss waited for c's dial";
  EXPECT_EQ(check->reported(), 1u);
  EXPECT_TRUE(f.store.check({f.rdzv->alive_key("c")}));
  auto stopped = std::async(std::launch::async, [&] { check.reset(); });
  EXPECT_EQ(stopped.wait_for(test::kEventually), std::future_status::ready)
      << "stopping the check waited for c's dial";
}

}  // namespace
}  // namespace weft::comm
