// Reshaping a big host block into another size (memory/huge_pages.h's reshape_host_block, as
// HostAllocator::reshape hands it out) keeps its bytes and its resident pages and leaves it at
// a 2 MiB boundary, whether it grows in place, grows by moving or shrinks; and the
// RecyclingAllocator's spares: under an expectation, a freed block of another size serves an
// expected size that nothing covers, reshaped, and the spares never hold more than those
// requests will allocate.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "memory/host_allocator.h"
#include "memory/huge_pages.h"
#include "memory/recycling_allocator.h"
#include "tests/support/resident_pages.h"

namespace weft::memory {
namespace {

using test::resident_pages;

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kPage = 4096;

void fill(void* p, size_t bytes, unsigned char seed) {
  auto* c = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < bytes; i += 512) c[i] = static_cast<unsigned char>(i / 512 * 31 + seed);
}

size_t mismatches(const void* p, size_t bytes, unsigned char seed) {
  const auto* c = static_cast<const unsigned char*>(p);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; i += 512)
    wrong += c[i] != static_cast<unsigned char>(i / 512 * 31 + seed);
  return wrong;
}

bool aligned_2mib(const void* p) { return reinterpret_cast<uintptr_t>(p) % kHugeBytes == 0; }

TEST(HostAllocatorReshape, AGrowKeepsTheBytesAndPagesAndAddsTheRest) {
  HostAllocator a;
  const size_t from = 40 * kMiB, to = 64 * kMiB;
  void* p = a.allocate(from);
  fill(p, from, 3);
  void* q = a.reshape(p, to);
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(aligned_2mib(q));
  EXPECT_EQ(mismatches(q, from, 3), 0u);
  EXPECT_EQ(resident_pages(q, from), from / kPage) << "the old pages stay resident";
  std::memset(static_cast<char*>(q) + from, 9, to - from);  // the added part is writable
  EXPECT_EQ(a.stats().bytes_live, to);
  if (q != p) {
    EXPECT_THROW(a.free(p), InternalError) << "the old pointer is gone";
  }
  a.free(q);
  EXPECT_EQ(a.stats().bytes_live, 0u);
}

// The range after the block is taken: the grow moves the mapping (page tables, not bytes) to
// another 2 MiB boundary.
TEST(HostAllocatorReshape, AGrowWhoseNextRangeIsTakenMovesToAnAlignedAddress) {
  HostAllocator a;
  const size_t from = 36 * kMiB, to = 50 * kMiB;
  void* p = a.allocate(from);
  fill(p, from, 5);
  void* blocker = ::mmap(static_cast<char*>(p) + from, kPage, PROT_READ,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(blocker, static_cast<void*>(static_cast<char*>(p) + from));
  void* q = a.reshape(p, to);
  ASSERT_NE(q, nullptr);
  EXPECT_NE(q, p) << "it could not grow in place";
  EXPECT_TRUE(aligned_2mib(q));
  EXPECT_EQ(mismatches(q, from, 5), 0u);
  EXPECT_EQ(resident_pages(q, from), from / kPage);
  std::memset(static_cast<char*>(q) + from, 1, to - from);
  a.free(q);
  ::munmap(blocker, kPage);
}

TEST(HostAllocatorReshape, AShrinkKeepsItsAddressAndGivesTheTailBack) {
  HostAllocator a;
  const size_t from = 48 * kMiB, to = 33 * kMiB;
  void* p = a.allocate(from);
  fill(p, from, 7);
  void* q = a.reshape(p, to);
  EXPECT_EQ(q, p);
  EXPECT_EQ(mismatches(q, to, 7), 0u);
  EXPECT_EQ(a.stats().bytes_live, to);
  unsigned char v = 0;
  EXPECT_NE(::mincore(static_cast<char*>(p) + from - kPage, kPage, &v), 0)
      << "the tail past the new size is unmapped";
  a.free(q);
}

TEST(HostAllocatorReshape, ASmallBlockIsNotReshaped) {
  HostAllocator a;
  void* small = a.allocate(4 * kMiB);
  EXPECT_EQ(a.reshape(small, 40 * kMiB), nullptr);
  void* big = a.allocate(40 * kMiB);
  EXPECT_EQ(a.reshape(big, 4 * kMiB), nullptr) << "into a size malloc would serve";
  EXPECT_EQ(a.stats().bytes_live, 44 * kMiB) << "both unchanged";
  a.free(small);
  a.free(big);
}

// A kept block of another size is what a reserve reshapes for the size it expects: its old
// pages stay (what was written there is still there), only the added part is faulted in, and
// the request of the expected size gets it.
TEST(RecyclingAllocatorSpares, AReserveReshapesAKeptBlockOfAnotherSize) {
  HostAllocator host;
  RecyclingAllocator r(host);
  const size_t old_size = 40 * kMiB, new_size = 60 * kMiB;
  void* p = r.allocate(old_size);
  fill(p, old_size, 11);
  r.free(p);  // no expectation: kept
  EXPECT_EQ(r.reserve({new_size}), new_size);
  EXPECT_EQ(r.reshaped(), 1u);
  EXPECT_EQ(host.stats().bytes_live, new_size) << "one block, not the old one beside a new one";
  void* q = r.allocate(new_size);
  EXPECT_TRUE(aligned_2mib(q));
  EXPECT_EQ(mismatches(q, old_size, 11), 0u) << "the old block's pages";
  EXPECT_EQ(resident_pages(q, new_size), new_size / kPage) << "the added part faulted in too";
  r.free(q);
  r.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// A shrink: the smallest spare at least the size is taken, and it stays where it was.
TEST(RecyclingAllocatorSpares, ARequestTakesTheSmallestSpareThatHoldsIt) {
  HostAllocator host;
  RecyclingAllocator r(host);
  const size_t size = 34 * kMiB;
  r.reserve({size, size, size}, 0);  // expects three, faults nothing
  void* big = r.allocate(40 * kMiB);   // not expected: live beside the expectation
  void* fit = r.allocate(36 * kMiB);
  fill(fit, 36 * kMiB, 2);
  r.free(big);
  r.free(fit);
  EXPECT_EQ(r.bytes_kept(), 76 * kMiB) << "two spares for three uncovered requests of 102 MiB";
  void* q = r.allocate(size);
  EXPECT_EQ(q, fit) << "the 36 MiB spare, shrunk in place";
  EXPECT_EQ(mismatches(q, size, 2), 0u);
  EXPECT_EQ(r.reshaped(), 1u);
  r.free(q);
  r.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// Spares hold no more than the uncovered expected requests will allocate: no more blocks than
// those requests, no more bytes than theirs; blocks below the spare size and blocks that would
// exceed either go back at once.
TEST(RecyclingAllocatorSpares, SparesNeverExceedWhatTheExpectedRequestsAllocate) {
  HostAllocator host;
  RecyclingAllocator r(host);
  void* b1 = r.allocate(40 * kMiB);
  void* b2 = r.allocate(40 * kMiB);
  void* huge = r.allocate(100 * kMiB);
  void* small = r.allocate(8 * kMiB);
  r.reserve({64 * kMiB}, 0);
  r.free(huge);  // more bytes than the one uncovered request of 64 MiB
  EXPECT_EQ(r.bytes_kept(), 0u);
  r.free(small);  // below the spare size
  EXPECT_EQ(r.bytes_kept(), 0u);
  r.free(b1);
  EXPECT_EQ(r.bytes_kept(), 40 * kMiB) << "a spare for the 64 MiB request";
  r.free(b2);
  EXPECT_EQ(r.bytes_kept(), 40 * kMiB) << "one request: one spare";
  EXPECT_EQ(host.stats().bytes_live, 40 * kMiB);
  // A reserve within a bound counts a reshaped spare in full: it holds no more than that.
  EXPECT_EQ(r.reserve({64 * kMiB, 64 * kMiB}, 64 * kMiB), 64 * kMiB);
  EXPECT_EQ(r.reshaped(), 1u);
  EXPECT_EQ(host.stats().bytes_live, 64 * kMiB) << "the spare became it: nothing beside it";
  r.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// Without an expectation nothing is reshaped: a request of another size returns the kept
// blocks, as before.
TEST(RecyclingAllocatorSpares, WithoutAnExpectationAMissReturnsTheKeptBlocks) {
  HostAllocator host;
  RecyclingAllocator r(host);
  void* p = r.allocate(40 * kMiB);
  r.free(p);
  void* q = r.allocate(50 * kMiB);
  EXPECT_EQ(r.reshaped(), 0u);
  EXPECT_EQ(r.bytes_kept(), 0u);
  EXPECT_EQ(host.stats().bytes_live, 50 * kMiB);
  r.free(q);
  r.trim();
}

}  // namespace
}  // namespace weft::memory
