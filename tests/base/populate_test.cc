// base/populate.h: pieces that cover exactly the whole pages of a range, and pages that are
// resident after populate_pages.
#include "base/populate.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "tests/support/resident_pages.h"

namespace weft {
namespace {

using test::resident_pages;

constexpr size_t kPage = 4096;

TEST(Populate, PiecesCoverTheWholePagesOfTheRangeInBoundedPageAlignedPieces) {
  // A range that starts and ends inside a page, 10 MiB and a bit: the partial pages at both
  // ends are left out, the rest is cut into pieces of at most kPopulatePieceBytes.
  const uintptr_t base = uintptr_t(1) << 32;
  const void* p = reinterpret_cast<const void*>(base + 100);
  const size_t bytes = (size_t(10) << 20) + 5000;
  const auto pieces = populate_pieces(p, bytes, kPage);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces.front().first, base + kPage);
  EXPECT_EQ(pieces.back().second, (base + 100 + bytes) / kPage * kPage);
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].first % kPage, 0u);
    EXPECT_EQ(pieces[i].second % kPage, 0u);
    EXPECT_GT(pieces[i].second, pieces[i].first);
    EXPECT_LE(pieces[i].second - pieces[i].first, kPopulatePieceBytes);
    if (i + 1 < pieces.size()) {
      EXPECT_EQ(pieces[i].second, pieces[i + 1].first) << "a gap or an overlap after piece " << i;
      EXPECT_EQ(pieces[i].second - pieces[i].first, kPopulatePieceBytes);
    }
  }
}

TEST(Populate, NoPiecesWhenNoWholePageFits) {
  const uintptr_t base = uintptr_t(1) << 32;
  EXPECT_TRUE(populate_pieces(reinterpret_cast<const void*>(base + 1), kPage, kPage).empty());
  EXPECT_TRUE(populate_pieces(reinterpret_cast<const void*>(base), kPage - 1, kPage).empty());
  EXPECT_TRUE(populate_pieces(reinterpret_cast<const void*>(base), 0, kPage).empty());
  EXPECT_EQ(populate_pieces(reinterpret_cast<const void*>(base), kPage, kPage).size(), 1u);
}

TEST(Populate, WriteMakesEveryPageOfAFreshMappingResidentAcrossManyPieces) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t bytes = 3 * kPopulatePieceBytes + 7 * page;  // four pieces, the last short
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(resident_pages(p, bytes), 0u);
  const int e = populate_pages(p, bytes, PageAccess::kWrite);
  if (e == EINVAL) {
    // A kernel before 5.14 (no MADV_POPULATE_WRITE): EINVAL from the first piece, nothing
    // mapped in, and the caller's writes fault the pages in as before.
    EXPECT_EQ(resident_pages(p, bytes), 0u);
    std::memset(p, 1, bytes);
  } else {
    EXPECT_EQ(e, 0) << std::strerror(e);
  }
  EXPECT_EQ(resident_pages(p, bytes), bytes / page);
  ::munmap(p, bytes);
}

TEST(Populate, ReadOfAMappingWithoutWriteAccessSucceedsAndWriteFailsNamingTheError) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t bytes = kPopulatePieceBytes + 3 * page;
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const int r = populate_pages(p, bytes, PageAccess::kRead);
  if (r == EINVAL) {
    // A kernel before 5.14: neither advice exists, and both say so.
    EXPECT_EQ(populate_pages(p, bytes, PageAccess::kWrite), EINVAL);
  } else {
    EXPECT_EQ(r, 0) << std::strerror(r);
    // Writing a read-only mapping's pages in cannot be done: the first piece's error comes
    // back.
    EXPECT_NE(populate_pages(p, bytes, PageAccess::kWrite), 0);
  }
  ::munmap(p, bytes);
}

}  // namespace
}  // namespace weft
