// An arena over a RecyclingAllocator (AllocatorSegmentSource): when the arena goes, its big
// segments stay resident in the recycling allocator instead of being unmapped, and the next
// layout's blocks of other sizes take their pages (reshaped spares), so writing them takes a
// page fault only for what they add. Small segments come from the host source and go back.
#include "memory/allocator_segment_source.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/host_allocator.h"
#include "memory/planned_allocator.h"
#include "memory/recycling_allocator.h"
#include "memory/trace.h"
#include "tests/support/resident_pages.h"

namespace weft::memory {
namespace {

using test::resident_pages;
using test::thread_minor_faults;

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kPage = 4096;

// The faults of writing the first `bytes` of `p`.
size_t faults_writing(void* p, size_t bytes, int value) {
  const size_t before = thread_minor_faults();
  std::memset(p, value, bytes);
  return thread_minor_faults() - before;
}

// A trainer's arena, then the next layout's block: the arena's 48 MiB segment is kept when the
// arena is destroyed, and a reserve for 64 MiB reshapes it, so writing the 64 MiB block's
// first 48 MiB takes no fault, where the same write into a fresh block (the arena over the
// host source, unmapped when it went) takes one per page (per 2 MiB with huge pages).
TEST(AllocatorSegmentSource, AnArenasPagesServeTheNextLayoutsBlock) {
  HostAllocator host;
  RecyclingAllocator recycling(host);
  const size_t old_bytes = 48 * kMiB, new_bytes = 64 * kMiB;
  void* old_block = nullptr;
  {
    AllocatorSegmentSource source(recycling);
    CachingAllocator arena(CachingOptions{}, &source);
    old_block = arena.allocate(old_bytes, Tag::kActivation);
    std::memset(old_block, 5, old_bytes);
    void* small = arena.allocate(4096, Tag::kActivation);
    EXPECT_EQ(recycling.stats().bytes_live, old_bytes)
        << "the small pool's 2 MiB segment comes from the host source, not the recycler";
    arena.free(small);
    arena.free(old_block);
  }
  EXPECT_EQ(recycling.bytes_kept(), old_bytes) << "the arena's segment kept, not unmapped";
  EXPECT_EQ(resident_pages(old_block, old_bytes), old_bytes / kPage);

  EXPECT_EQ(recycling.reserve({new_bytes}), new_bytes);
  EXPECT_EQ(recycling.reshaped(), 1u);
  EXPECT_EQ(host.stats().bytes_live, new_bytes) << "one block: the old one reshaped";
  void* recycled = recycling.allocate(new_bytes, Tag::kParameter);
  const size_t recycled_faults = faults_writing(recycled, old_bytes, 9);

  // The yardstick: the same arena over the host source.
  {
    CachingAllocator arena;
    void* p = arena.allocate(old_bytes, Tag::kActivation);
    std::memset(p, 5, old_bytes);
    arena.free(p);
  }
  HostAllocator fresh_host;
  void* fresh = fresh_host.allocate(new_bytes, Tag::kParameter);
  const size_t fresh_faults = faults_writing(fresh, old_bytes, 9);
  std::printf(
      "writing 48 MiB of the next layout's block: %zu faults in the old arena's pages, "
      "%zu in fresh ones\n",
      recycled_faults, fresh_faults);
  EXPECT_GE(fresh_faults, old_bytes / (2 * kMiB)) << "a fresh page faults at its first write";
  EXPECT_LE(recycled_faults, 2u) << "the old arena's pages are resident in the new block";
  fresh_host.free(fresh);
  recycling.free(recycled);
  recycling.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// A planned arena's segments (its arena and its fallback pool) come through the source too.
TEST(AllocatorSegmentSource, APlannedArenaReservesThroughTheAllocator) {
  HostAllocator host;
  RecyclingAllocator recycling(host);
  AllocatorSegmentSource source(recycling);
  TraceBuilder step;
  step.free(step.alloc(40 * kMiB, Tag::kActivation));
  {
    PlannedAllocator planned(step.trace(), PlannedOptions{}, &source, &source);
    EXPECT_GE(recycling.stats().bytes_live, 40 * kMiB) << "the arena from the recycler";
  }
  EXPECT_EQ(recycling.stats().bytes_live, 0u);
  EXPECT_GE(recycling.bytes_kept(), 40 * kMiB) << "kept when the arena went";
  recycling.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

}  // namespace
}  // namespace weft::memory
