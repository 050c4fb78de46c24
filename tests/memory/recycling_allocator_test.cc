// RecyclingAllocator: a freed large block serves the next request of its size; a request
// that finds none returns the kept blocks first; small blocks are never kept; blocks reserved
// ahead for an expectation are resident and stay until taken or no longer expected.
#include "memory/recycling_allocator.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

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

// Blocks reserved ahead serve the requests of their sizes; a reserve replaces the last one's
// expectation (kept blocks that no expected request takes go back; sizes already kept are not
// reserved again); small sizes are not reserved.
TEST(RecyclingAllocator, ReservedBlocksServeTheirSizesAndAReserveReplacesTheLast) {
  HostAllocator host;
  RecyclingAllocator a(host, 1024);
  EXPECT_EQ(a.reserve({4096, 4096, 8192, 100}), 4096u * 2 + 8192u);
  EXPECT_EQ(a.bytes_kept(), 4096u * 2 + 8192u);
  EXPECT_EQ(host.stats().bytes_live, 4096u * 2 + 8192u);
  EXPECT_EQ(a.reserve({4096, 8192}), 0u) << "both kept already";
  EXPECT_EQ(host.stats().bytes_live, 4096u + 8192u) << "the second 4096 is no longer expected";
  EXPECT_EQ(a.reserve({4096, 4096, 4096}), 4096u * 2);
  EXPECT_EQ(host.stats().bytes_live, 4096u * 3) << "the 8192 went back, two 4096 came";
  void* p = a.allocate(4096);
  static_cast<unsigned char*>(p)[4095] = 1;  // a whole block of its own
  void* q = a.allocate(4096);
  EXPECT_EQ(a.reused(), 2u);
  EXPECT_EQ(host.stats().bytes_live, 4096u * 3);
  a.free(p);
  a.free(q);
}

// With an expectation, what a request misses does not return the reserved blocks (another
// expected request takes them), and a freed block is kept only while its size is still
// expected: a router's source freed during a move goes back to the system at once.
TEST(RecyclingAllocator, UnderAnExpectationAMissKeepsTheReserveAndUnexpectedFreesGoBack) {
  HostAllocator host;
  RecyclingAllocator a(host, 1024);
  void* old = a.allocate(16384);  // a source of the last layout, live while the move starts
  a.reserve({4096, 8192});
  void* miss = a.allocate(2048);  // expected by nobody: from the base, the reserve stays
  EXPECT_EQ(a.bytes_kept(), 4096u + 8192u);
  void* p = a.allocate(8192);
  EXPECT_EQ(a.reused(), 1u);
  a.free(old);  // 16384 is not expected: back to the base now, not kept
  EXPECT_EQ(a.bytes_kept(), 4096u);
  EXPECT_EQ(host.stats().bytes_live, 2048u + 8192u + 4096u);
  a.free(p);  // its size's expected request was served already: back too
  EXPECT_EQ(a.bytes_kept(), 4096u);
  EXPECT_EQ(host.stats().bytes_live, 2048u + 4096u);
  void* q = a.allocate(4096);
  void* q2 = a.allocate(4096);  // the second has no kept block: the base's
  a.free(q);  // nothing of 4096 is expected any more
  a.free(q2);
  EXPECT_EQ(a.bytes_kept(), 0u);
  a.free(miss);
  EXPECT_EQ(host.stats().bytes_live, 0u);
  // trim() drops the expectation: freed blocks are kept again, a miss returns them.
  void* r = a.allocate(4096);
  a.trim();
  a.free(r);
  EXPECT_EQ(a.bytes_kept(), 4096u);
  a.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// max_new_bytes bounds what a reserve allocates: the sizes in the order given, a size that
// does not fit skipped for smaller ones after it; 0 only sets the expectation.
TEST(RecyclingAllocator, AReserveAllocatesWithinItsBoundInTheOrderGiven) {
  HostAllocator host;
  RecyclingAllocator a(host, 1024);
  EXPECT_EQ(a.reserve({8192, 16384, 4096, 4096}, 8192 + 4096 + 2048), 8192u + 4096u);
  EXPECT_EQ(host.stats().bytes_live, 8192u + 4096u);
  EXPECT_EQ(a.reserve({8192, 16384}, 0), 0u);
  EXPECT_EQ(a.bytes_kept(), 8192u) << "the 4096 went back; nothing allocated";
  a.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// Blocks handed out that the caller frees before the expected requests come (a trainer's
// gradients when a reserve starts beside its last step) cover their size: the reserve
// allocates only the sizes they do not cover, and each, freed, is kept for its size and
// serves its request; a later reserve for the same sizes finds them kept.
TEST(RecyclingAllocator, ReturningBlocksCoverTheirSizesAndAreKeptWhenFreed) {
  HostAllocator host;
  RecyclingAllocator a(host, 1024);
  void* grad = a.allocate(8192);   // live through the step
  void* other = a.allocate(2048);  // a size nobody expects
  EXPECT_EQ(a.reserve({8192, 8192, 4096}, SIZE_MAX, {8192, 2048}), 8192u + 4096u)
      << "one 8192 is returning: only the second and the 4096 are new";
  EXPECT_EQ(host.stats().bytes_live, 8192u * 2 + 2048u + 4096u);
  a.free(grad);
  EXPECT_EQ(a.bytes_kept(), 8192u * 2 + 4096u) << "freed: kept for its expected size";
  a.free(other);
  EXPECT_EQ(a.bytes_kept(), 8192u * 2 + 4096u) << "returning but not expected: back to the base";
  EXPECT_EQ(a.reserve({8192, 8192, 4096}), 0u) << "all kept";
  void* p = a.allocate(8192);
  void* q = a.allocate(8192);
  EXPECT_EQ(p == grad || q == grad, true) << "the freed gradient served a request";
  EXPECT_EQ(a.reused(), 2u);
  a.free(p);
  a.free(q);
  a.trim();
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

// A reserved block's pages are in memory before anything writes them (what the reserve is
// for): mincore sees every page of it resident. 8 MiB comes from mmap, untouched until then.
TEST(RecyclingAllocator, AReservedBlockIsResidentBeforeItsFirstWrite) {
  const size_t bytes = size_t(8) << 20, page = size_t(::sysconf(_SC_PAGESIZE));
  RecyclingAllocator a;
  a.reserve({bytes});
  void* p = a.allocate(bytes);
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const size_t n = (reinterpret_cast<uintptr_t>(p) + bytes - lo) / page;
  std::vector<unsigned char> vec(n);
  ASSERT_EQ(::mincore(reinterpret_cast<void*>(lo), n * page, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  EXPECT_EQ(resident, n);
  a.free(p);
}

// A base allocator whose allocations wait at a gate until the test opens it, counting them.
class GatedAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Tag tag) override {
    entered = true;
    while (!open) std::this_thread::yield();
    ++allocs;
    return host.allocate(bytes, tag);
  }
  void free(void* p) override { host.free(p); }
  AllocatorStats stats() const override { return host.stats(); }
  std::string name() const override { return "gated"; }
  HostAllocator host;
  std::atomic<bool> entered{false}, open{false};
  std::atomic<int> allocs{0};
};

// A request for the size a reserve is faulting in on another thread waits for that block
// instead of faulting a second one (the router's first destinations while a survivor's
// reserve is still running); the reserve then keeps nothing for it.
TEST(RecyclingAllocator, ARequestForTheSizeInFlightWaitsForTheReservedBlock) {
  GatedAllocator base;
  RecyclingAllocator a(base, 1024);
  std::thread reserving([&] { a.reserve({size_t(1) << 20}); });
  while (!base.entered) std::this_thread::yield();  // the block is in flight now
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // lets the request wait first
    base.open = true;
  });
  void* p = a.allocate(size_t(1) << 20);
  opener.join();
  reserving.join();
  EXPECT_EQ(base.allocs, 1) << "one block, faulted by the reserve";
  EXPECT_EQ(a.reused(), 1u);
  EXPECT_EQ(a.bytes_kept(), 0u);
  a.free(p);
  EXPECT_EQ(base.host.stats().bytes_live, 0u) << "no longer expected: back to the base";
}

}  // namespace
}  // namespace weft::memory
