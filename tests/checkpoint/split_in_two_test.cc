// checkpoint/split_in_two.h: every piece once, on the caller and the process's helper thread,
// and a call that finds the helper busy finishes alone.
#include "checkpoint/split_in_two.h"

#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace weft::checkpoint {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

// The ranges fn was called with, by thread.
struct Calls {
  std::mutex mu;
  std::map<std::thread::id, std::vector<std::pair<int64_t, int64_t>>> by_thread;
  void add(int64_t from, int64_t to) {
    std::lock_guard<std::mutex> l(mu);
    by_thread[std::this_thread::get_id()].push_back({from, to});
  }
  // Every byte of [0, total) exactly once, every cut on a multiple of `unit`, each thread's
  // ranges in increasing order.
  void expect_cover(int64_t total, int64_t unit) {
    std::map<int64_t, int64_t> all;
    for (const auto& [id, v] : by_thread)
      for (size_t i = 0; i < v.size(); ++i) {
        all[v[i].first] = v[i].second;
        if (i > 0) {
          EXPECT_LT(v[i - 1].first, v[i].first);
        }
      }
    int64_t at = 0;
    for (const auto& [from, to] : all) {
      EXPECT_EQ(from, at) << "a gap or an overlap before byte " << from;
      EXPECT_EQ(from % unit, 0) << "a cut inside a unit at byte " << from;
      EXPECT_LT(from, to);
      at = to;
    }
    EXPECT_EQ(at, total);
  }
};

TEST(SplitInTwo, EveryPieceRunsOnceCutOnTheUnitOnAtMostTwoThreads) {
  const int64_t unit = kMiB, total = 200 * kMiB + 12345;  // the last piece short
  Calls calls;
  split_in_two(total, unit, [&](int64_t from, int64_t to) { calls.add(from, to); });
  calls.expect_cover(total, unit);
  EXPECT_LE(calls.by_thread.size(), 2u);
  for (const auto& [id, v] : calls.by_thread)
    for (const auto& [from, to] : v) EXPECT_LE(to - from, kSplitPieceBytes);
}

TEST(SplitInTwo, WorkBelowTheThresholdRunsOnceWholeOnTheCaller) {
  Calls calls;
  split_in_two(kSplitBytes - 1, 1, [&](int64_t from, int64_t to) { calls.add(from, to); });
  ASSERT_EQ(calls.by_thread.size(), 1u);
  EXPECT_EQ(calls.by_thread.begin()->first, std::this_thread::get_id());
  ASSERT_EQ(calls.by_thread.begin()->second.size(), 1u);
  EXPECT_EQ(calls.by_thread.begin()->second[0], (std::pair<int64_t, int64_t>{0, kSplitBytes - 1}));
}

TEST(SplitInTwo, ACallThatFindsTheHelperBusyFinishesAloneAndTheOtherWhenReleased) {
  if (std::thread::hardware_concurrency() < 2) {
    // One core: no helper thread; a call runs whole on its caller, as below the threshold.
    Calls calls;
    split_in_two(128 * kMiB, kMiB, [&](int64_t from, int64_t to) { calls.add(from, to); });
    ASSERT_EQ(calls.by_thread.size(), 1u);
    EXPECT_EQ(calls.by_thread.begin()->first, std::this_thread::get_id());
    EXPECT_EQ(calls.by_thread.begin()->second,
              (std::vector<std::pair<int64_t, int64_t>>{{0, 128 * kMiB}}));
    return;
  }
  // Call A's pieces on the helper block until released; A's own pieces wait until the helper
  // holds one, so the helper is busy with A's work when B comes.
  std::promise<void> helper_in, release;
  std::shared_future<void> in = helper_in.get_future().share(), go = release.get_future().share();
  const int64_t total = 128 * kMiB;
  Calls a_calls;
  std::thread a([&] {
    const std::thread::id caller = std::this_thread::get_id();
    bool first = true;
    split_in_two(total, kMiB, [&](int64_t from, int64_t to) {
      a_calls.add(from, to);
      if (std::this_thread::get_id() != caller) {
        if (std::exchange(first, false)) helper_in.set_value();
        go.wait();
      } else {
        in.wait();
      }
    });
  });
  in.wait();
  Calls b_calls;
  split_in_two(total, kMiB, [&](int64_t from, int64_t to) { b_calls.add(from, to); });
  ASSERT_EQ(b_calls.by_thread.size(), 1u);
  EXPECT_EQ(b_calls.by_thread.begin()->first, std::this_thread::get_id());
  b_calls.expect_cover(total, kMiB);
  release.set_value();
  a.join();
  // The helper ran some of A's pieces (it was held in one); the caller may have run none, if
  // it was descheduled until the released helper had taken the rest.
  EXPECT_LE(a_calls.by_thread.size(), 2u);
  a_calls.expect_cover(total, kMiB);
}

}  // namespace
}  // namespace weft::checkpoint
