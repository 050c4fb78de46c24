// CachingAllocator: PyTorch's rounding, pools, best-fit, splitting, coalescing, cache
// release and OOM retry; no overlap over long random sequences.
#include "memory/caching_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "base/error.h"
#include "memory/host_allocator.h"
#include "memory_test_util.h"

namespace weft::memory {
namespace {

constexpr size_t KiB = 1 << 10, MiB = 1 << 20;

const CachingBlockInfo* block_at(const std::vector<CachingSegmentInfo>& snap, const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& s : snap)
    for (const auto& b : s.blocks)
      if (s.address + b.offset == a) return &b;
  return nullptr;
}

TEST(CachingAllocator, RoundsTo512AndServesSmallFromTwoMiBSegments) {
  CachingAllocator a;
  void* p = a.allocate(1);
  void* q = a.allocate(513);
  void* z = a.allocate(0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
  auto snap = a.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_TRUE(snap[0].small);
  EXPECT_EQ(snap[0].bytes, 2 * MiB);
  EXPECT_EQ(block_at(snap, p)->size, 512u);
  EXPECT_EQ(block_at(snap, q)->size, 1024u);
  EXPECT_EQ(block_at(snap, z)->size, 512u);
  EXPECT_NE(p, z);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.bytes_live, 1u + 513u);
  EXPECT_EQ(s.bytes_reserved, 2 * MiB);
  EXPECT_EQ(a.caching_stats().bytes_allocated, 2048u);
  a.free(p);
  a.free(q);
  a.free(z);
}

TEST(CachingAllocator, LargeSegmentSizesFollowPyTorch) {
  CachingAllocator a;
  void* big = a.allocate(11 * MiB);                // >= 10 MiB: the request rounded to 2 MiB
  void* mid = a.allocate(3 * MiB);                 // 1..10 MiB: a 20 MiB segment, split
  void* whole = a.allocate(19 * MiB + 512 * KiB);  // 20 MiB segment, 0.5 MiB rest: no split
  auto snap = a.snapshot();
  ASSERT_EQ(snap.size(), 3u);
  size_t twenty = 0, twelve = 0;
  for (const auto& s : snap) {
    EXPECT_FALSE(s.small);
    twenty += s.bytes == 20 * MiB;
    twelve += s.bytes == 12 * MiB;
  }
  EXPECT_EQ(twenty, 2u);
  EXPECT_EQ(twelve, 1u);
  EXPECT_EQ(block_at(snap, big)->size, 12 * MiB);  // a 1 MiB rest is not > 1 MiB: kept whole
  EXPECT_EQ(block_at(snap, mid)->size, 3 * MiB);
  EXPECT_EQ(block_at(snap, whole)->size, 20 * MiB);
  EXPECT_EQ(block_at(snap, whole)->requested, 19 * MiB + 512 * KiB);
  // The 3 MiB block's segment kept a 17 MiB free remainder, which serves the next request.
  void* reuse = a.allocate(5 * MiB);
  EXPECT_EQ(static_cast<char*>(reuse), static_cast<char*>(mid) + 3 * MiB);
  EXPECT_EQ(a.snapshot().size(), 3u);
  for (void* p : {mid, big, whole, reuse}) a.free(p);
}

TEST(CachingAllocator, BestFitTakesTheSmallestFreeBlock) {
  CachingAllocator a;
  void* A = a.allocate(16 * KiB);
  void* s1 = a.allocate(512);
  void* B = a.allocate(8 * KiB);
  void* s2 = a.allocate(512);
  a.free(A);
  a.free(B);  // holes of 16 KiB and 8 KiB, kept apart by s1 and s2; the tail is free too
  EXPECT_EQ(a.allocate(8 * KiB), B);
  void* c = a.allocate(12 * KiB);
  EXPECT_EQ(c, A);
  auto snap = a.snapshot();
  const CachingBlockInfo* rest = block_at(snap, static_cast<char*>(A) + 12 * KiB);
  ASSERT_NE(rest, nullptr);  // the 4 KiB remainder was split off and is free
  EXPECT_FALSE(rest->allocated);
  EXPECT_EQ(rest->size, 4 * KiB);
  for (void* p : {s1, s2, B, c}) a.free(p);
}

TEST(CachingAllocator, FreedNeighboursCoalesceWithinASegment) {
  CachingAllocator a;
  void* x = a.allocate(4 * KiB);
  void* y = a.allocate(4 * KiB);
  void* z = a.allocate(4 * KiB);
  a.free(y);
  EXPECT_EQ(a.snapshot()[0].blocks.size(), 4u);  // x, free y, z, free tail
  a.free(x);
  auto blocks = a.snapshot()[0].blocks;
  ASSERT_EQ(blocks.size(), 3u);  // free x+y, z, free tail
  EXPECT_EQ(blocks[0].size, 8 * KiB);
  EXPECT_FALSE(blocks[0].allocated);
  a.free(z);
  blocks = a.snapshot()[0].blocks;
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].size, 2 * MiB);
  // The merged block serves the largest small request from the segment's start.
  void* all = a.allocate(1 * MiB);
  EXPECT_EQ(all, x);
  a.free(all);
}

TEST(CachingAllocator, SegmentsNeverMergeSoOrderMatters) {
  // ezyang's example: 8 x 16 MiB then 4 x 32 MiB reserves 256 MiB; the reverse order 128.
  auto run = [](std::vector<size_t> first, std::vector<size_t> second) {
    CachingAllocator a;
    for (auto* sizes : {&first, &second}) {
      std::vector<void*> ps;
      for (size_t n : *sizes) ps.push_back(a.allocate(n));
      for (void* p : ps) a.free(p);
    }
    return a.stats().bytes_reserved;
  };
  std::vector<size_t> sixteens(8, 16 * MiB), thirty_twos(4, 32 * MiB);
  EXPECT_EQ(run(sixteens, thirty_twos), 256 * MiB);
  EXPECT_EQ(run(thirty_twos, sixteens), 128 * MiB);
}

TEST(CachingAllocator, EmptyCacheReleasesOnlySegmentsWithoutLiveBlocks) {
  HostSegmentSource source;
  CachingAllocator a({}, &source);
  void* huge = a.allocate(12 * MiB);  // first, or best-fit would put it in large's segment
  void* small = a.allocate(1000);
  void* large = a.allocate(4 * MiB);
  EXPECT_EQ(source.bytes_held(), 2 * MiB + 20 * MiB + 12 * MiB);
  a.free(huge);
  a.empty_cache();
  EXPECT_EQ(source.bytes_held(), 22 * MiB);
  EXPECT_EQ(a.stats().bytes_reserved, 22 * MiB);
  a.free(small);
  a.free(large);
  for (const auto& s : a.snapshot()) EXPECT_EQ(s.blocks.size(), 1u);
  a.empty_cache();
  EXPECT_EQ(source.bytes_held(), 0u);
  EXPECT_EQ(a.stats().bytes_reserved, 0u);
  EXPECT_EQ(a.stats().bytes_reserved_peak, 34 * MiB);
  EXPECT_EQ(a.caching_stats().num_segment_releases, 3u);
}

// An arena whose owner went while a block was still live (a send in flight): the segments
// without a live block go back at once, the other as soon as its last block is freed, and a
// freed block of it is not cached any more.
TEST(CachingAllocator, ReleaseAsFreedReturnsEachSegmentWhenItsLastBlockIsFreed) {
  HostSegmentSource source;
  CachingAllocator a({}, &source);
  void* huge = a.allocate(12 * MiB);
  void* large = a.allocate(4 * MiB);
  void* large2 = a.allocate(4 * MiB);  // the same 20 MiB segment as `large`
  void* small = a.allocate(1000);
  a.free(huge);
  EXPECT_EQ(source.bytes_held(), 12 * MiB + 20 * MiB + 2 * MiB) << "cached";
  a.release_as_freed();
  EXPECT_EQ(source.bytes_held(), 20 * MiB + 2 * MiB) << "the free segment went back";
  a.free(large);
  EXPECT_EQ(source.bytes_held(), 20 * MiB + 2 * MiB) << "its segment still holds a live block";
  a.free(large2);
  EXPECT_EQ(source.bytes_held(), 2 * MiB) << "its last block freed: the segment went back";
  a.free(small);
  EXPECT_EQ(source.bytes_held(), 0u);
  EXPECT_EQ(a.stats().bytes_reserved, 0u);
  EXPECT_EQ(a.caching_stats().num_segment_releases, 3u);
}

TEST(CachingAllocator, OutOfMemoryReleasesTheCacheAndRetriesOnce) {
  HostSegmentSource source(24 * MiB);
  CachingAllocator a({}, &source);
  a.free(a.allocate(3 * MiB));       // a cached 20 MiB segment
  void* s = a.allocate(1000);        // 2 MiB small segment: 22 MiB held
  void* big = a.allocate(21 * MiB);  // needs a 22 MiB segment: only after the cache goes
  EXPECT_EQ(a.caching_stats().num_alloc_retries, 1u);
  EXPECT_EQ(source.bytes_held(), 24 * MiB);
  EXPECT_THROW(a.allocate(30 * MiB), std::bad_alloc);
  EXPECT_EQ(a.caching_stats().num_ooms, 1u);
  EXPECT_EQ(a.caching_stats().num_alloc_retries, 2u);
  EXPECT_EQ(a.stats().bytes_live, 1000 + 21 * MiB);  // the failed request changed nothing
  a.free(s);
  a.free(big);
}

TEST(CachingAllocator, UnknownAndDoubleFreesThrowWithoutChangingState) {
  CachingAllocator a;
  void* p = a.allocate(100);
  int local = 0;
  AllocatorStats before = a.stats();
  EXPECT_THROW(a.free(&local), InternalError);
  EXPECT_THROW(a.free(static_cast<char*>(p) + 64), InternalError);  // inside a block
  EXPECT_EQ(a.stats().bytes_live, before.bytes_live);
  EXPECT_EQ(a.stats().num_frees, 0u);
  EXPECT_TRUE(a.owns(p));
  a.free(p);
  EXPECT_THROW(a.free(p), InternalError);
  EXPECT_EQ(a.stats().num_frees, 1u);
}

TEST(CachingAllocator, RandomSequencesNeverOverlapAndCoalesceFully) {
  for (uint64_t seed : {1, 2, 3}) {
    HostSegmentSource source;
    CachingAllocator a({}, &source);
    testing::LiveRangeChecker checker;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0, 1);
    struct Live {
      void* p;
      size_t n;
      uint64_t key;
    };
    std::vector<Live> live;
    size_t live_bytes = 0;
    for (uint64_t i = 0; i < 20000; ++i) {
      if (live.empty() || u(rng) < 0.5) {
        // Mostly small, some in the 1-10 MiB band, a few above it.
        double r = u(rng);
        size_t n = r < 0.85   ? size_t(u(rng) * 64 * KiB)
                   : r < 0.98 ? size_t((1 + u(rng) * 8) * MiB)
                              : size_t((10 + u(rng) * 6) * MiB);
        void* p = a.allocate(n);
        ASSERT_TRUE(checker.add(p, n));
        size_t touched = std::min<size_t>(n, 4096);  // enough to catch aliasing, cheap
        testing::fill_pattern(p, touched, i);
        live.push_back({p, n, i});
        live_bytes += n;
      } else {
        size_t j = rng() % live.size();
        Live b = live[j];
        ASSERT_TRUE(testing::check_pattern(b.p, std::min<size_t>(b.n, 4096), b.key));
        checker.remove(b.p);
        a.free(b.p);
        live[j] = live.back();
        live.pop_back();
        live_bytes -= b.n;
      }
      ASSERT_EQ(a.stats().bytes_live, live_bytes);
    }
    for (const Live& b : live) a.free(b.p);
    AllocatorStats s = a.stats();
    EXPECT_EQ(s.bytes_live, 0u);
    EXPECT_GE(s.bytes_reserved_peak, s.bytes_live_peak);
    for (const auto& seg : a.snapshot()) {
      ASSERT_EQ(seg.blocks.size(), 1u) << "segment not coalesced back into one block";
      EXPECT_EQ(seg.blocks[0].size, seg.bytes);
      EXPECT_FALSE(seg.blocks[0].allocated);
    }
    EXPECT_EQ(a.caching_stats().bytes_inactive_split, 0u);
    a.empty_cache();
    EXPECT_EQ(source.bytes_held(), 0u);
    EXPECT_EQ(a.caching_stats().num_segments, 0u);
  }
}

TEST(CachingAllocator, ConcurrentThreadsGetDisjointBlocks) {
  CachingAllocator a;
  testing::LiveRangeChecker checker;
  testing::hammer_from_threads(a, checker, 3000, 256 * KiB, Tag::kOther, 10);
  EXPECT_EQ(a.stats().bytes_live, 0u);
  EXPECT_EQ(checker.live(), 0u);
}

TEST(HostAllocator, StillServesTensorsAndRejectsBadFrees) {
  Allocator& h = default_host_allocator();
  size_t before = h.stats().bytes_live;
  void* p = h.allocate(100, Tag::kActivation);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Allocator::kAlignment, 0u);
  EXPECT_EQ(h.stats().bytes_live, before + 100);
  int local = 0;
  EXPECT_THROW(h.free(&local), InternalError);
  h.free(p);
  EXPECT_EQ(h.stats().bytes_live, before);
  h.begin_step();  // the step context is optional: a no-op here
  h.set_phase(Phase::kForward, 0);
}

}  // namespace
}  // namespace weft::memory
