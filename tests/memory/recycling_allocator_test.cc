// RecyclingAllocator: a freed large block serves the next request of its size; a request
// that finds none returns the kept blocks first; small blocks are never kept.
#include "memory/recycling_allocator.h"

#include <gtest/gtest.h>

#include <cstring>

#include "base/error.h"
#include "memory/host_allocator.h"

namespace weft::memory {
namespace {

TEST(RecyclingAllocator, AFreedBlockServesTheNextRequestOfItsSize) {
  HostAllocator host;
  RecyclingAllocator a(host, 1024);
  void* p = a.allocate(4096, Tag::kGradient);
  void* q = a.allocate(8192, Tag::kGradient);
  std::memset(p, 7, 4096);
  a.free(p);
  a.free(q);
  EXPECT_EQ(a.bytes_kept(), 4096u + 8192u);
  EXPECT_EQ(host.stats().bytes_live, 4096u + 8192u) << "kept, not returned";
  EXPECT_EQ(a.allocate(8192), q);
  void* p2 = a.allocate(4096);
  EXPECT_EQ(p2, p);
  EXPECT_EQ(static_cast<unsigned char*>(p2)[4095], 7) << "contents as the last user left them";
  EXPECT_EQ(a.reused(), 2u);
  EXPECT_EQ(a.bytes_kept(), 0u);
  a.free(p2);
  a.free(q);
  a.trim();
  EXPECT_EQ(a.bytes_kept(), 0u);
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

TEST(RecyclingAllocator, ARequestThatFindsNoBlockReturnsTheKeptOnesFirst) {
  HostAllocator host;
  RecyclingAllocator a(host, 1024);
  void* p = a.allocate(4096);
  void* q = a.allocate(8192);
  a.free(p);
  a.free(q);
  EXPECT_EQ(host.stats().bytes_live, 4096u + 8192u);
  void* r = a.allocate(2048);  // no block of this size: the kept ones go back first
  EXPECT_EQ(a.bytes_kept(), 0u);
  EXPECT_EQ(host.stats().bytes_live, 2048u);
  EXPECT_EQ(a.reused(), 0u);
  a.free(r);
}

TEST(RecyclingAllocator, SmallBlocksGoBackAtOnceAndStatsCountBoth) {
  HostAllocator host;
  RecyclingAllocator a(host, 1024);
  void* s = a.allocate(100);
  void* big = a.allocate(2048);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.bytes_live, 2148u);
  EXPECT_EQ(st.num_allocs, 2u);
  a.free(s);
  a.free(big);
  EXPECT_EQ(a.bytes_kept(), 2048u);
  st = a.stats();
  EXPECT_EQ(st.bytes_live, 0u);
  EXPECT_EQ(st.bytes_reserved, 2048u);
  EXPECT_EQ(st.num_frees, 2u);
  EXPECT_EQ(host.stats().bytes_live, 2048u);
  EXPECT_THROW(a.free(&st), InternalError);
}

TEST(RecyclingAllocator, TheDestructorReturnsTheKeptBlocks) {
  HostAllocator host;
  {
    RecyclingAllocator a(host, 1);
    void* p = a.allocate(64);
    void* q = a.allocate(128);
    a.free(p);
    a.free(q);
    EXPECT_EQ(host.stats().bytes_live, 192u);
  }
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// Blocks reserved ahead serve the requests of their sizes; a second reserve of the same sizes
// (or of sizes already kept) reserves nothing more; small sizes are not reserved.
TEST(RecyclingAllocator, ReservedBlocksServeTheirSizesAndAreNotReservedTwice) {
  HostAllocator host;
  RecyclingAllocator a(host, 1024);
  a.reserve({4096, 4096, 8192, 100});
  EXPECT_EQ(a.bytes_kept(), 4096u * 2 + 8192u);
  EXPECT_EQ(host.stats().bytes_live, 4096u * 2 + 8192u);
  a.reserve({4096, 8192});
  EXPECT_EQ(host.stats().bytes_live, 4096u * 2 + 8192u) << "already kept";
  a.reserve({4096, 4096, 4096});
  EXPECT_EQ(host.stats().bytes_live, 4096u * 3 + 8192u) << "one more 4096";
  void* p = a.allocate(8192);
  static_cast<unsigned char*>(p)[8191] = 1;  // a whole block of its own
  void* q = a.allocate(4096);
  EXPECT_EQ(a.reused(), 2u);
  EXPECT_EQ(host.stats().bytes_live, 4096u * 3 + 8192u);
  a.free(p);
  a.free(q);
}

}  // namespace
}  // namespace weft::memory
