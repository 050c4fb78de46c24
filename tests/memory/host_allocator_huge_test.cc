// Big host blocks (memory/huge_pages.h), as HostAllocator and HostSegmentSource hand them
// out: each of at least kHugeMinBytes starts at a 2 MiB boundary in a mapping advised MADV_HUGEPAGE
// (so that it faults in and is walked by the TLB 2 MiB at a time), its bytes are what was written,
// and freeing it unmaps it; smaller blocks are left to malloc.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "memory/host_allocator.h"
#include "memory/huge_pages.h"
#include "memory/recycling_allocator.h"
#include "memory/segment_source.h"

namespace weft::memory {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

// The smaps entry of the mapping that holds `p`: its VmFlags and AnonHugePages (kB).
struct Mapping {
  bool found = false;
  uintptr_t lo = 0, hi = 0;
  std::string flags;
  long huge_kb = 0;
};

Mapping mapping_of(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream f("/proc/self/smaps");
  Mapping m;
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
      if (m.found) break;  // the next mapping's header
      in = at >= lo && at < hi;
      if (in) m.found = true, m.lo = lo, m.hi = hi;
      continue;
    }
    if (!in) continue;
    if (line.rfind("VmFlags:", 0) == 0) m.flags = line.substr(8);
    if (line.rfind("AnonHugePages:", 0) == 0) m.huge_kb = std::stol(line.substr(14));
  }
  return m;
}

bool advised_huge(const Mapping& m) {
  return (" " + m.flags + " ").find(" hg ") != std::string::npos;
}

std::string thp_setting() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s;
}

TEST(HostAllocatorHugePages, ABigBlockStartsAtA2MiBBoundaryInAnAdvisedMappingOfItsOwn) {
  HostAllocator a;  // keeps nothing: a freed block goes back at once
  const size_t bytes = kHugeMinBytes + kMiB + 100;  // a tail past the last 2 MiB boundary
  auto* p = static_cast<unsigned char*>(a.allocate(bytes));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugeBytes, 0u);
  const Mapping m = mapping_of(p);
  ASSERT_TRUE(m.found);
  EXPECT_TRUE(advised_huge(m)) << "VmFlags:" << m.flags;
  EXPECT_GE(m.hi, reinterpret_cast<uintptr_t>(p) + bytes) << "the block is in one mapping";
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7 + 3);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += p[i] != static_cast<unsigned char>(i * 7 + 3);
  EXPECT_EQ(wrong, 0u);
  a.free(p);
  EXPECT_FALSE(mapping_of(p).found && advised_huge(mapping_of(p)))
      << "a freed block's mapping is gone";
  EXPECT_EQ(a.stats().bytes_live, 0u);
}

TEST(HostAllocatorHugePages, ABlockBelowTheThresholdIsLeftToMalloc) {
  HostAllocator a;
  void* p = a.allocate(kHugeMinBytes - 4096);
  const Mapping m = mapping_of(p);
  ASSERT_TRUE(m.found);
  EXPECT_FALSE(advised_huge(m)) << "VmFlags:" << m.flags;
  a.free(p);
}

TEST(HostAllocatorHugePages, ABigArenaSegmentIsAdvisedToo) {
  HostSegmentSource source;
  const size_t bytes = kHugeMinBytes;
  void* p = source.reserve(bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugeBytes, 0u);
  const Mapping m = mapping_of(p);
  ASSERT_TRUE(m.found);
  EXPECT_TRUE(advised_huge(m)) << "VmFlags:" << m.flags;
  source.release(p, bytes);
  EXPECT_EQ(source.bytes_held(), 0u);
}

// Where the host gives transparent huge pages to advised ranges, a written big block is
// backed by them (the kernel compacts memory for an advised fault under the default defrag);
// where it gives none, the block works in 4 KiB pages (the advice is only advice).
TEST(HostAllocatorHugePages, AWrittenBigBlockIsBackedByHugePagesWhereTheHostGivesThem) {
  const std::string thp = thp_setting();
  const bool thp_on = !thp.empty() && thp.find("[never]") == std::string::npos;
  HostAllocator a(true);
  const size_t bytes = kHugeMinBytes + 4 * kMiB;
  void* p = a.allocate(bytes);
  std::memset(p, 1, bytes);
  const Mapping m = mapping_of(p);
  ASSERT_TRUE(m.found);
  if (thp_on)
    EXPECT_GE(m.huge_kb, long(kHugeBytes / 1024)) << "AnonHugePages of the block; THP: " << thp;
  else
    EXPECT_EQ(m.huge_kb, 0) << "AnonHugePages of the block; THP: " << thp;
  a.free(p);  // kept: the same mapping serves the next request of its size
  void* q = a.allocate(bytes);
  EXPECT_EQ(q, p);
  EXPECT_EQ(static_cast<unsigned char*>(q)[bytes - 1], 1);
  a.free(q);
  a.trim();
}

// A reserve faults its block in ahead in 4 KiB pages (recycling_allocator.cc: fresh 2 MiB
// pages fault slower on a VM whose hypervisor takes free memory back), and the request of its
// size gets that block with what was written into it.
TEST(HostAllocatorHugePages, AReservedBlockIsFaultedInIn4KiBPages) {
  HostAllocator base;
  RecyclingAllocator r(base);
  const size_t bytes = kHugeMinBytes;
  ASSERT_EQ(r.reserve({bytes}), bytes);
  auto* p = static_cast<unsigned char*>(r.allocate(bytes));
  const Mapping m = mapping_of(p);
  ASSERT_TRUE(m.found);
  EXPECT_NE((" " + m.flags + " ").find(" nh "), std::string::npos) << "VmFlags:" << m.flags;
  EXPECT_EQ(m.huge_kb, 0) << "AnonHugePages of the reserved block";
  std::memset(p, 5, bytes);
  EXPECT_EQ(p[bytes / 2], 5);
  r.free(p);
  r.trim();
}

}  // namespace
}  // namespace weft::memory
