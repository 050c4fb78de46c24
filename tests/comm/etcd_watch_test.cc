// EtcdStore's blocking reads park on an etcd watch (comm/store/etcd_watch.h), against a real
// etcd: the member holds one watcher while a wait is parked and none after it returns, the
// parked wait reads only at its recheck, another client's set ends it, another thread's stop
// ends it at once, and no descriptor or thread outlives the waits. etcd's own counters (its
// /metrics page) say what it served.
#include "comm/store/etcd_watch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/store/etcd_store.h"
#include "tests/comm/etcd_cluster.h"
#include "tests/comm/etcd_metrics.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::EtcdStore;
using comm::EtcdStoreOptions;
using comm::Millis;
using Clock = std::chrono::steady_clock;

// Watchers that start at a revision etcd has passed: etcd sends them their events only at
// its next catch-up (syncWatchersLoop, every 100 ms), not as the change happens.
constexpr const char* kSlowWatchers = "etcd_debugging_mvcc_slow_watcher_total";

class EtcdWatchTest : public EtcdOneMemberTest {
 protected:
  EtcdWatchTest() : EtcdOneMemberTest("/w/") {}
};

TEST_F(EtcdWatchTest, AParkedGetHoldsOneWatcherReadsOnlyAtItsRecheckAndAnotherClientsSetEndsIt) {
  auto reader = client();
  auto writer = client();
  ASSERT_FALSE(writer->check({"late"}));
  ASSERT_EQ(watchers(), 0);
  const double ranges_before = etcd_metric(cluster_->endpoint(0), kEtcdRanges);
  ASSERT_GE(ranges_before, 0) << kEtcdRanges << " is not on etcd's /metrics page";

  auto got = std::async(std::launch::async, [&] { return reader->get_string("late"); });
  ASSERT_TRUE(eventually([&] { return watchers() == 1; })) << "the parked get holds no watch";
  const auto parked = Clock::now();
  std::this_thread::sleep_for(2500ms);
  // A poll would have read about 50 times by now (every 50 ms); parked on the watch, the
  // get reads once before the watch, once after it and once per 1 s recheck.
  const double reads = etcd_metric(cluster_->endpoint(0), kEtcdRanges) - ranges_before;
  const double seconds = std::chrono::duration<double>(Clock::now() - parked).count();
  std::printf("[ measure ] reads by a get parked %.1f s: %.0f\n", seconds, reads);
  EXPECT_LE(reads, 3 + seconds) << "the parked get polls";
  EXPECT_EQ(got.wait_for(0s), std::future_status::timeout) << "returned before the set";

  writer->set_string("late", "value");
  EXPECT_EQ(got.get(), "value");
  EXPECT_TRUE(eventually([&] { return watchers() == 0; })) << "the returned get left its watch";
}

TEST_F(EtcdWatchTest, AWaitOnSeveralKeysSkipsTheOthersInItsRangeAndEndsWhenAllExist) {
  auto waiter = client();
  auto writer = client();
  auto done = std::async(std::launch::async, [&] { waiter->wait({"a", "c"}, 20s); });
  ASSERT_TRUE(eventually([&] { return watchers() == 1; }));
  for (int i = 0; i < 5; ++i) writer->set_string("b", std::to_string(i));  // inside [a, c]
  writer->set_string("a", "1");
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(done.wait_for(0s), std::future_status::timeout) << "returned with 'c' missing";
  writer->set_string("c", "1");
  done.get();  // rethrows a TimeoutError
  EXPECT_TRUE(eventually([&] { return watchers() == 0; }));
}

TEST_F(EtcdWatchTest, TimeoutsStillNameTheKeysAndNoWaitLeavesADescriptorOrAThread) {
  auto waiter = client(150ms);
  auto writer = client();
  waiter->ping();  // the store's own connection is open before the count
  writer->ping();
  count_before();
  for (int i = 0; i < 10; ++i) {
    const std::string key = "never" + std::to_string(i);
    try {
      waiter->wait({key, "other"}, 150ms);
      FAIL() << "wait returned with its keys missing";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
    EXPECT_THROW(waiter->get(key), TimeoutError);
    const std::string set = "set" + std::to_string(i);
    waiter->set_timeout(20s);
    auto got = std::async(std::launch::async, [&] { return waiter->get_string(set); });
    std::this_thread::sleep_for(20ms);
    writer->set_string(set, "v");
    EXPECT_EQ(got.get(), "v");
    waiter->set_timeout(150ms);
  }
  expect_nothing_left();
}

// Issue 14's trailing survivor: a wait's watch that started at its read's revision + 1 was
// behind etcd whenever anything was written between the read and the watch (here another
// client's stream of sets), and etcd delivered its event only at its next 100 ms catch-up.
// A wait watches from etcd's current revision and reads again: its watcher is in sync, seen
// in the same scrape of etcd's gauges as the watcher itself. Not always: etcd's watch server
// turns "from now" into its revision + 1 a few microseconds before it registers the watcher,
// and a set in between leaves even that watcher behind (2 of 30 here under back-to-back
// sets, against 26 of 30 from the read's revision + 1), hence at most a third.
TEST_F(EtcdWatchTest, AWaitsWatchIsInSyncWithEtcdWhileOtherClientsWrite) {
  auto waiter = client();
  auto writer = client();
  auto busy = client();
  ASSERT_GE(etcd_metric(cluster_->endpoint(0), kSlowWatchers), 0)
      << kSlowWatchers << " is not on etcd's /metrics page";
  std::atomic<bool> stop{false};
  std::atomic<int64_t> sets{0};
  std::thread churn([&] {
    for (int64_t i = 0; !stop.load(); ++i, sets.fetch_add(1))
      busy->set_string("busy", std::to_string(i));
  });
  int behind = 0;
  for (int i = 0; i < 30; ++i) {
    const std::string key = "sync" + std::to_string(i);
    auto done = std::async(std::launch::async, [&] { waiter->wait({key}, 20s); });
    std::vector<double> seen;
    ASSERT_TRUE(eventually([&] {
      seen = etcd_metrics(cluster_->endpoint(0), {kEtcdWatchers, kSlowWatchers});
      return seen[0] == 1;
    })) << "the wait holds no watch";
    if (seen[1] > 0) ++behind;
    writer->set_string(key, "v");
    done.get();
    ASSERT_TRUE(eventually([&] { return watchers() == 0; }));
  }
  stop.store(true);
  churn.join();
  std::printf("[ measure ] waits whose watch was behind etcd: %d of 30 (%lld sets meanwhile)\n",
              behind, static_cast<long long>(sets.load()));
  ASSERT_GT(sets.load(), 30) << "nobody wrote while the waits parked";
  EXPECT_LE(behind, 10) << "waits' watches started at a revision etcd had passed";
}

// wait_stoppable and wait_gone_stoppable: another thread's stop ends a wait parked on its
// watch for a minute at once, and the watch goes with it; a stop before the call makes no
// watch at all; the store's next waits watch and return as before.
TEST_F(EtcdWatchTest, AStopEndsAWaitParkedOnItsWatchAndTheWatchGoesWithIt) {
  constexpr Millis kPark{60'000};  // longer than the test: a timeout would throw, not return
  auto waiter = client();
  auto writer = client();
  waiter->ping();  // the store's own connection is open before the count
  writer->set_string("there", "v");
  ASSERT_GE(watches_made(), 0) << kEtcdWatchStreamsStarted << " is not on etcd's /metrics page";
  count_before();
  for (int i = 0; i < 3; ++i) {
    std::stop_source stop;
    auto waited = std::async(std::launch::async, [&] {
      return waiter->wait_stoppable({"never"}, kPark, stop.get_token());
    });
    ASSERT_TRUE(eventually([&] { return watchers() == 1; })) << "the wait holds no watch";
    stop.request_stop();
    ASSERT_EQ(waited.wait_for(20s), std::future_status::ready) << "the stop did not end it";
    EXPECT_FALSE(waited.get()) << "not stopped (a timeout throws)";
    EXPECT_TRUE(eventually([&] { return watchers() == 0; })) << "the stopped wait left its watch";

    std::stop_source stop_gone;
    auto gone = std::async(std::launch::async, [&] {
      return waiter->wait_gone_stoppable({"there"}, kPark, stop_gone.get_token());
    });
    ASSERT_TRUE(eventually([&] { return watchers() == 1; }));
    stop_gone.request_stop();
    ASSERT_EQ(gone.wait_for(20s), std::future_status::ready) << "the stop did not end it";
    EXPECT_EQ(gone.get(), std::nullopt);
    EXPECT_TRUE(eventually([&] { return watchers() == 0; }));
  }

  std::stop_source stopped;
  stopped.request_stop();
  const double made = watches_made();
  EXPECT_FALSE(waiter->wait_stoppable({"never"}, kPark, stopped.get_token()));
  EXPECT_EQ(waiter->wait_gone_stoppable({"there"}, kPark, stopped.get_token()), std::nullopt);
  EXPECT_EQ(watches_made(), made) << "a wait stopped before it began made a watch";

  std::stop_source idle;
  auto waited = std::async(std::launch::async, [&] {
    return waiter->wait_stoppable({"late"}, kPark, idle.get_token());
  });
  ASSERT_TRUE(eventually([&] { return watchers() == 1; }));
  writer->set_string("late", "v");
  EXPECT_TRUE(waited.get());
  auto gone = std::async(std::launch::async, [&] {
    return waiter->wait_gone_stoppable({"late", "there"}, kPark, idle.get_token());
  });
  ASSERT_TRUE(eventually([&] { return watchers() == 1; }));
  EXPECT_TRUE(writer->erase("there"));
  EXPECT_EQ(gone.get(), std::vector<std::string>{"there"});
  expect_nothing_left();
}

// Printed, not asserted: the time from another client's set to the parked get's return,
// over 50 sets, each after the get has waited 150..200 ms (a poll at its slowest pace).
TEST_F(EtcdWatchTest, MeasureFiftySetsEachWakeAParkedGet) {
  auto reader = client();
  auto writer = client();
  std::vector<double> ms;
  for (int i = 0; i < 50; ++i) {
    const std::string key = "wake" + std::to_string(i);
    std::promise<Clock::time_point> returned;
    std::thread t([&] {
      EXPECT_EQ(reader->get_string(key), "v");
      returned.set_value(Clock::now());
    });
    std::this_thread::sleep_for(150ms + Millis(i % 50));
    const auto set = Clock::now();
    writer->set_string(key, "v");
    ms.push_back(
        std::chrono::duration<double, std::milli>(returned.get_future().get() - set).count());
    t.join();
  }
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double m : ms) sum += m;
  std::printf(
      "[ measure ] set -> parked get returns, 50 sets: mean %.2f ms, median %.2f ms, "
      "p90 %.2f ms, max %.2f ms\n",
      sum / ms.size(), ms[ms.size() / 2], ms[ms.size() * 9 / 10], ms.back());
}

}  // namespace
}  // namespace weft::test
