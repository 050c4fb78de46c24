// Store::wait_gone: a wait until one of some keys is absent, woken by the removal itself (an
// erase, a TTL's end, a bound key dropped when its client's process died), over TCPStore and
// InMemoryStore alike; the table's removal log underneath. Every wait here is a hang guard:
// where a test must know the waiter is parked it asks the server, never the clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/store/cancellable_store.h"
#include "comm/store/in_memory_store.h"
#include "comm/store/kv_table.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "tests/comm/killable_client.h"
#include "tests/comm/store_flavour.h"
#include "tests/support/eventually.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::KvTable;
using comm::Millis;
using comm::SetOptions;
using comm::TCPStore;
using comm::TCPStoreServer;
using comm::TCPStoreServerOptions;
using comm::to_bytes;
using Keys = std::vector<std::string>;

// --- The table's removal log -------------------------------------------------------------------

TEST(KvTableRemovals, EveryWayAKeyGoesIsLoggedOnceAndOnlyWhenAsked) {
  KvTable table(1 << 20);
  table.set("quiet", to_bytes("v"), std::nullopt);
  EXPECT_TRUE(table.erase("quiet"));
  EXPECT_TRUE(table.take_removed().empty()) << "the log is off by default";

  table.log_removals(true);
  table.set("erased", to_bytes("v"), std::nullopt);
  table.set("expires", to_bytes("v"), Millis(1));
  table.set("bound-now", to_bytes("v"), std::nullopt, /*owner=*/7);
  table.set("bound-later", to_bytes("v"), std::nullopt, /*owner=*/8);
  table.set("stays", to_bytes("v"), std::nullopt);
  EXPECT_TRUE(table.erase("erased"));
  EXPECT_FALSE(table.erase("erased")) << "a second erase removes nothing";
  EXPECT_EQ(table.release(7, Millis(0)), 1u);  // a goodbye: dropped at once
  std::vector<KvTable::Released> released;
  KvTable::Clock::time_point at;
  EXPECT_EQ(table.release(8, Millis(600'000), &released, &at), 1u);
  EXPECT_TRUE(table.find("bound-later")) << "in its grace";
  EXPECT_EQ(table.drop_released(released), 1u);  // its process exited
  std::this_thread::sleep_for(5ms);
  table.expire();
  Keys removed = table.take_removed();
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (Keys{"bound-later", "bound-now", "erased", "expires"}));
  EXPECT_TRUE(table.take_removed().empty()) << "taken once";
  EXPECT_TRUE(table.find("stays"));
}

// --- Both stores that can ----------------------------------------------------------------------

class StoreWaitGone : public ::testing::TestWithParam<bool> {
 protected:
  Flavour make() const { return GetParam() ? tcp_flavour() : memory_flavour(); }
};

TEST_P(StoreWaitGone, KeysAlreadyAbsentAreReturnedAtOnceInTheOrderGiven) {
  Flavour f = make();
  EXPECT_TRUE(f.waiter->waits_for_absence());
  f.other->set("b", to_bytes("v"));
  EXPECT_EQ(f.waiter->wait_gone({"c", "b", "a"}, 10s), (Keys{"c", "a"}));
  EXPECT_EQ(f.parked(), f.server ? 0 : -1) << "nothing was parked";
}

TEST_P(StoreWaitGone, AnEraseWakesAWaiterParkedOnItsKeysWithTheKeyThatWent) {
  Flavour f = make();
  f.other->set("a", to_bytes("v"));
  f.other->set("b", to_bytes("v"));
  auto gone = std::async(std::launch::async, [&] { return f.waiter->wait_gone({"a", "b"}, 20s); });
  until_parked(f, 1);
  f.other->set("a", to_bytes("w"));  // a write is no removal: the waiter stays
  EXPECT_EQ(gone.wait_for(50ms), std::future_status::timeout);
  EXPECT_TRUE(f.other->erase("b"));
  EXPECT_EQ(gone.get(), (Keys{"b"}));
  EXPECT_TRUE(f.other->check({"a"}));
}

TEST_P(StoreWaitGone, AKeysTtlEndingWakesTheWaiter) {
  Flavour f = make();
  f.other->set("beat", to_bytes("v"), Millis(300));
  f.other->set("plain", to_bytes("v"));
  EXPECT_EQ(f.waiter->wait_gone({"plain", "beat"}, 20s), (Keys{"beat"}));
  EXPECT_TRUE(f.other->check({"plain"}));
}

TEST_P(StoreWaitGone, TimesOutNamingTheKeysWhileEveryOneExists) {
  Flavour f = make();
  f.other->set("a", to_bytes("v"));
  try {
    f.waiter->wait_gone({"a"}, 100ms);
    FAIL() << "wait_gone returned while its key exists";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("one of key a to go"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.parked(), f.server ? 0 : -1) << "the timed-out wait is no longer parked";
  // The store still answers on the same client.
  EXPECT_TRUE(f.waiter->erase("a"));
  EXPECT_EQ(f.waiter->wait_gone({"a"}, 1s), (Keys{"a"}));
}

TEST_P(StoreWaitGone, PrefixAndCancellableStoresForwardItInTheirOwnNames) {
  Flavour f = make();
  auto prefixed = std::make_shared<comm::PrefixStore>("job", f.waiter);
  EXPECT_TRUE(prefixed->waits_for_absence());
  f.other->set("job/k", to_bytes("v"));
  auto gone = std::async(std::launch::async, [&] { return prefixed->wait_gone({"k"}, 20s); });
  until_parked(f, 1);
  f.other->erase("job/k");
  EXPECT_EQ(gone.get(), (Keys{"k"})) << "named as the namespace names it";

  // Cancellable: waits in slices and gives up when told to.
  std::atomic<bool> stop{false};
  comm::CancellableStore cancellable(
      f.waiter, [&] { return stop ? "epoch replaced" : ""; }, 20ms);
  f.other->set("c", to_bytes("v"));
  auto cancelled = std::async(std::launch::async, [&] {
    try {
      cancellable.wait_gone({"c"}, 20s);
      return std::string("returned");
    } catch (const CommError& e) {
      return std::string(e.what());
    }
  });
  stop = true;
  EXPECT_EQ(cancelled.get(), "epoch replaced");
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreWaitGone, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tcp" : "InMemory"; });

// The point of it: a client process that binds a key and is SIGKILLed. The server drops the
// key when the process has exited (the grace is ten minutes, so only that drop can end the
// wait), and the parked waiter returns with it. Forked before the server starts, so the
// child copies no running thread.
TEST(StoreWaitGoneProcesses, ABoundKeyOfAKilledClientProcessWakesAParkedWaiter) {
  KillableClient child([](TCPStore& client) {
    client.set("alive/n1", to_bytes("v"), SetOptions{.ttl = Millis(600'000), .bind = true});
  });
  TCPStoreServerOptions o;
  o.bound_key_grace = Millis(600'000);
  TCPStoreServer server(o);
  ASSERT_TRUE(child.start(server.port())) << "the client process did not bind its key";
  TCPStore waiter("127.0.0.1", server.port(), 10s);
  waiter.set("alive/n2", to_bytes("v"));
  auto gone = std::async(std::launch::async, [&] {
    return waiter.wait_gone({"alive/n2", "alive/n1"}, 30s);
  });
  ASSERT_TRUE(eventually([&] { return server.stats().waits_parked == 1; }));
  EXPECT_TRUE(child.kill_and_reap());
  ASSERT_EQ(gone.wait_for(20s), std::future_status::ready) << "the drop did not wake the waiter";
  EXPECT_EQ(gone.get(), (Keys{"alive/n1"}));
  EXPECT_EQ(server.stats().bound_keys_dropped_at_exit, 1u);
}

}  // namespace
}  // namespace weft::test
