// HostAllocator's kept blocks: a freed large block serves the next request of its size, small
// ones go back at once, and live plus kept never exceeds the most that was ever live.
#include "memory/host_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace weft::memory {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

TEST(HostAllocatorKeep, AFreedLargeBlockServesTheNextRequestOfItsSize) {
  HostAllocator a(true);
  void* p = a.allocate(3 * kMiB);
  a.free(p);
  EXPECT_EQ(a.bytes_kept(), 3 * kMiB);
  EXPECT_EQ(a.stats().bytes_reserved, 3 * kMiB) << "kept blocks are reserved";
  void* q = a.allocate(3 * kMiB);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.reused(), 1u);
  EXPECT_EQ(a.bytes_kept(), 0u);
  a.free(q);
  a.trim();
  EXPECT_EQ(a.bytes_kept(), 0u);
  EXPECT_EQ(a.stats().bytes_reserved, 0u);
}

TEST(HostAllocatorKeep, SmallBlocksAndAnAllocatorThatDoesNotKeepReturnAtOnce) {
  HostAllocator keeping(true), plain;
  keeping.free(keeping.allocate(HostAllocator::kKeepBytes - 64));
  EXPECT_EQ(keeping.bytes_kept(), 0u);
  plain.free(plain.allocate(8 * kMiB));
  EXPECT_EQ(plain.bytes_kept(), 0u);
  EXPECT_EQ(plain.stats().bytes_reserved, 0u);
}

TEST(HostAllocatorKeep, ARequestOfAnotherSizeBeyondThePeakReturnsKeptBlocksFirst) {
  HostAllocator a(true);
  void* x = a.allocate(4 * kMiB);
  void* y = a.allocate(2 * kMiB);
  a.free(x);
  a.free(y);  // live peak 6 MiB; kept 6 MiB
  void* z = a.allocate(5 * kMiB);  // 5 + 6 > 6: the oldest (4 MiB) goes, 2 MiB fits beside
  EXPECT_EQ(a.bytes_kept(), 0u) << "5 MiB live + 2 MiB kept would be 7 MiB, over the 6 MiB peak";
  EXPECT_LE(a.stats().bytes_reserved, 6 * kMiB);
  a.free(z);
}

TEST(HostAllocatorKeep, KeepsNoMoreThanItsCap) {
  HostAllocator a(true, 4 * kMiB);
  void* x = a.allocate(3 * kMiB);
  void* y = a.allocate(3 * kMiB);
  a.free(x);
  a.free(y);  // 3 + 3 MiB would exceed the 4 MiB cap: y goes back to the system
  EXPECT_EQ(a.bytes_kept(), 3 * kMiB);
  EXPECT_EQ(a.stats().bytes_reserved, 3 * kMiB);
}

// Random programs of allocations and frees over a few large sizes: after every call, what the
// allocator holds (live plus kept) is at most the largest live total so far, every block is
// distinct, and a block's bytes survive until it is freed.
TEST(HostAllocatorKeep, LivePlusKeptNeverExceedsTheLivePeak) {
  std::mt19937 rng(11);
  const std::vector<size_t> sizes = {1 * kMiB, 3 * kMiB, 3 * kMiB + 64, 7 * kMiB};
  for (int program = 0; program < 20; ++program) {
    HostAllocator a(true, size_t(1) << 40);  // the peak bound alone, not the cap
    std::vector<std::pair<unsigned char*, size_t>> live;
    size_t live_bytes = 0, peak = 0;
    for (int op = 0; op < 200; ++op) {
      if (live.empty() || rng() % 2) {
        const size_t n = sizes[rng() % sizes.size()];
        auto* p = static_cast<unsigned char*>(a.allocate(n));
        for (const auto& [q, m] : live) ASSERT_TRUE(p + n <= q || q + m <= p) << "overlapping blocks";
        p[0] = p[n - 1] = static_cast<unsigned char>(op);
        live.emplace_back(p, n);
        live_bytes += n;
        peak = std::max(peak, live_bytes);
      } else {
        const size_t k = rng() % live.size();
        a.free(live[k].first);
        live_bytes -= live[k].second;
        live.erase(live.begin() + long(k));
      }
      ASSERT_LE(a.stats().bytes_reserved, peak) << "program " << program << ", call " << op;
      ASSERT_EQ(a.stats().bytes_live, live_bytes);
    }
    for (const auto& [p, n] : live) a.free(p);
    EXPECT_GT(a.reused(), 0u) << "program " << program << " never reused a block";
  }
}

}  // namespace
}  // namespace weft::memory
