// FreeSpace against a byte map: take/give keep the free ranges exact and coalesced, and
// best_fit picks the smallest fitting range inside the allowed windows.
#include "memory/free_space.h"

#include <gtest/gtest.h>

#include <random>

#include "base/error.h"

namespace weft::memory {
namespace {

TEST(FreeSpace, BestFitTakesTheSmallestRangeInsideTheWindows) {
  FreeSpace f;
  f.reset(1000);
  f.take(100, 200);
  f.take(300, 900);  // free: [0,100) [200,300) [900,1000)
  EXPECT_EQ(f.num_ranges(), 3u);
  FreeSpace::Ranges all{{0, 1000}};
  EXPECT_EQ(f.best_fit(100, all), 0u);  // three ranges of 100: the lowest
  EXPECT_EQ(f.best_fit(101, all), FreeSpace::kNone);
  f.give(300, 350);  // [200,350) is now 150 long
  EXPECT_EQ(f.best_fit(120, all), 200u);
  EXPECT_EQ(f.best_fit(50, {{950, 1000}}), 950u);  // only inside the window
  EXPECT_EQ(f.best_fit(60, {{950, 1000}}), FreeSpace::kNone);
  EXPECT_EQ(f.best_fit(80, {{0, 40}, {230, 320}}), 230u);
  EXPECT_TRUE(f.is_free(200, 350));
  EXPECT_FALSE(f.is_free(200, 351));
  EXPECT_THROW(f.take(150, 160), InternalError);
  EXPECT_THROW(f.give(0, 10), InternalError);
}

TEST(FreeSpace, RandomTakesAndGivesMatchAByteMap) {
  constexpr uint64_t kBytes = 4096;
  FreeSpace f;
  f.reset(kBytes);
  std::vector<bool> used(kBytes, false);
  std::vector<std::pair<uint64_t, uint64_t>> taken;
  std::mt19937_64 rng(17);
  for (int i = 0; i < 20000; ++i) {
    if (taken.empty() || rng() % 2) {
      uint64_t size = 1 + rng() % 64;
      uint64_t lo = rng() % (kBytes - size);
      bool free_now = true;
      for (uint64_t b = lo; b < lo + size; ++b) free_now &= !used[b];
      ASSERT_EQ(f.is_free(lo, lo + size), free_now);
      if (!free_now) {
        uint64_t fit = f.best_fit(size, {{0, kBytes}});
        if (fit == FreeSpace::kNone) continue;
        lo = fit;
      }
      f.take(lo, lo + size);
      for (uint64_t b = lo; b < lo + size; ++b) {
        ASSERT_FALSE(used[b]);
        used[b] = true;
      }
      taken.emplace_back(lo, lo + size);
    } else {
      size_t j = rng() % taken.size();
      auto [lo, hi] = taken[j];
      f.give(lo, hi);
      for (uint64_t b = lo; b < hi; ++b) used[b] = false;
      taken[j] = taken.back();
      taken.pop_back();
    }
    // Coalesced: exactly one range per maximal run of free bytes.
    size_t runs = 0;
    for (uint64_t b = 0; b < kBytes; ++b) runs += !used[b] && (b == 0 || used[b - 1]);
    ASSERT_EQ(f.num_ranges(), runs);
  }
}

}  // namespace
}  // namespace weft::memory
