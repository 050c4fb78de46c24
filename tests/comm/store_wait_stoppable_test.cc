// Store::wait_stoppable and wait_gone_stoppable: a wait that another thread ends through a
// std::stop_token, over TCPStore and InMemoryStore (each ends the parked wait at once), a
// PrefixStore over them, and Store's own slices (a store without one: CancellableStore). The
// waits park for a minute; that the stop returns them long before is what is asserted, and
// every other wait is a hang guard.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "comm/store/cancellable_store.h"
#include "comm/store/prefix_store.h"
#include "tests/comm/store_flavour.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::to_bytes;
using Keys = std::vector<std::string>;

// Longer than any test here runs. A wait that returns false (nullopt) was stopped: its
// timeout would throw TimeoutError.
constexpr comm::Millis kPark{60'000};

class StoreWaitStoppable : public ::testing::TestWithParam<bool> {
 protected:
  Flavour make() const { return GetParam() ? tcp_flavour() : memory_flavour(); }
};

TEST_P(StoreWaitStoppable, AStopEndsAParkedWaitAndAParkedWaitGoneAtOnce) {
  Flavour f = make();
  std::stop_source stop;
  auto waited = std::async(std::launch::async, [&] {
    return f.waiter->wait_stoppable({"never"}, kPark, stop.get_token());
  });
  until_parked(f, 1);
  stop.request_stop();
  ASSERT_EQ(waited.wait_for(20s), std::future_status::ready) << "the stop did not end the wait";
  EXPECT_FALSE(waited.get()) << "a stopped wait says so";

  f.other->set("there", to_bytes("v"));
  std::stop_source stop_gone;
  auto gone = std::async(std::launch::async, [&] {
    return f.waiter->wait_gone_stoppable({"there"}, kPark, stop_gone.get_token());
  });
  // TCP: the stopped wait stays parked at the server until its key or its timeout.
  until_parked(f, 2);
  stop_gone.request_stop();
  ASSERT_EQ(gone.wait_for(20s), std::future_status::ready) << "the stop did not end wait_gone";
  EXPECT_EQ(gone.get(), std::nullopt);
  EXPECT_TRUE(f.other->check({"there"}));
}

// TCP: the server answers the stopped waits later (their keys came); the client drops those
// replies, and its connection carries the next calls as before.
TEST_P(StoreWaitStoppable, TheClientGoesOnAfterAStopAndTheStoppedWaitsLateReplies) {
  Flavour f = make();
  f.other->set("there", to_bytes("v"));
  for (int i = 0; i < 3; ++i) {
    std::stop_source stop;
    auto waited = std::async(std::launch::async, [&] {
      return f.waiter->wait_stoppable({"late"}, kPark, stop.get_token());
    });
    auto gone = std::async(std::launch::async, [&] {
      return f.waiter->wait_gone_stoppable({"there"}, kPark, stop.get_token());
    });
    until_parked(f, 2);
    stop.request_stop();
    EXPECT_FALSE(waited.get());
    EXPECT_EQ(gone.get(), std::nullopt);
    f.other->set("late", to_bytes("v"));   // answers the stopped wait at the server
    EXPECT_TRUE(f.other->erase("there"));  // and the stopped wait_gone
    until_parked(f, 0);
    EXPECT_EQ(f.waiter->get("late"), to_bytes("v"));
    EXPECT_TRUE(f.other->erase("late"));
    f.other->set("there", to_bytes("v"));
  }
  // Not stopped, the same calls return what they waited for.
  std::stop_source never;
  auto waited = std::async(std::launch::async, [&] {
    return f.waiter->wait_stoppable({"late"}, kPark, never.get_token());
  });
  until_parked(f, 1);
  f.other->set("late", to_bytes("v"));
  EXPECT_TRUE(waited.get());
  auto gone = std::async(std::launch::async, [&] {
    return f.waiter->wait_gone_stoppable({"late", "there"}, kPark, never.get_token());
  });
  until_parked(f, 1);
  EXPECT_TRUE(f.other->erase("there"));
  EXPECT_EQ(gone.get(), (Keys{"there"}));
}

TEST_P(StoreWaitStoppable, AStopRequestedBeforeTheCallReturnsAtOnceWithoutWaiting) {
  Flavour f = make();
  f.other->set("there", to_bytes("v"));
  std::stop_source stop;
  stop.request_stop();
  EXPECT_FALSE(f.waiter->wait_stoppable({"never"}, kPark, stop.get_token()));
  EXPECT_EQ(f.waiter->wait_gone_stoppable({"there"}, kPark, stop.get_token()), std::nullopt);
  EXPECT_EQ(f.parked(), f.server ? 0 : -1) << "nothing was parked";
  // Timeouts are the plain waits' own.
  std::stop_source idle;
  EXPECT_THROW(f.waiter->wait_stoppable({"never"}, 50ms, idle.get_token()), TimeoutError);
  EXPECT_THROW(f.waiter->wait_gone_stoppable({"there"}, 50ms, idle.get_token()), TimeoutError);
}

TEST_P(StoreWaitStoppable, APrefixStoreForwardsTheStopAndNamesTheKeysItsWay) {
  Flavour f = make();
  comm::PrefixStore prefixed("job", f.waiter);
  f.other->set("job/k", to_bytes("v"));
  std::stop_source stop;
  auto waited = std::async(std::launch::async, [&] {
    return prefixed.wait_stoppable({"never"}, kPark, stop.get_token());
  });
  until_parked(f, 1);
  stop.request_stop();
  ASSERT_EQ(waited.wait_for(20s), std::future_status::ready);
  EXPECT_FALSE(waited.get());
  std::stop_source idle;
  auto gone = std::async(std::launch::async, [&] {
    return prefixed.wait_gone_stoppable({"k"}, kPark, idle.get_token());
  });
  until_parked(f, f.server ? 2 : 1);  // TCP: the stopped wait is still at the server
  EXPECT_TRUE(f.other->erase("job/k"));
  EXPECT_EQ(gone.get(), (Keys{"k"})) << "named as the namespace names it";
}

// A store without a wait of its own that a stop ends (CancellableStore forwards none): Store's
// default waits in kStopSlice slices and looks at the stop between them.
TEST_P(StoreWaitStoppable, StoresOwnWaitInSlicesEndsAtTheSliceAfterTheStop) {
  Flavour f = make();
  comm::CancellableStore slices(f.waiter, [] { return std::string(); });
  f.other->set("there", to_bytes("v"));
  std::stop_source stop;
  auto waited = std::async(std::launch::async, [&] {
    return slices.wait_stoppable({"never"}, kPark, stop.get_token());
  });
  auto gone = std::async(std::launch::async, [&] {
    return slices.wait_gone_stoppable({"there"}, kPark, stop.get_token());
  });
  until_parked(f, 2);
  stop.request_stop();
  ASSERT_EQ(waited.wait_for(20s), std::future_status::ready);
  ASSERT_EQ(gone.wait_for(20s), std::future_status::ready);
  EXPECT_FALSE(waited.get());
  EXPECT_EQ(gone.get(), std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreWaitStoppable, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tcp" : "InMemory"; });

}  // namespace
}  // namespace weft::test
