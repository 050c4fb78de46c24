// Big host blocks at 2 MiB boundaries, advised MADV_HUGEPAGE (huge_pages.h).
#include "memory/huge_pages.h"

#include <sys/mman.h>  // mremap: g++ defines _GNU_SOURCE

#include <cstdint>
#include <cstdlib>

namespace weft::memory {
namespace {

constexpr size_t kPage = 4096;

size_t page_round(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// `len` bytes mapped at a 2 MiB boundary with `prot` and `flags`: maps 2 MiB more and unmaps
// what lies before the first boundary and after the block's last page.
void* map_aligned(size_t len, int prot, int flags) {
  void* m = ::mmap(nullptr, len + kHugeBytes, prot, flags | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (at + kHugeBytes - 1) / kHugeBytes * kHugeBytes;
  if (start > at) ::munmap(m, start - at);
  if (const uintptr_t end = at + len + kHugeBytes; end > start + len)
    ::munmap(reinterpret_cast<void*>(start + len), end - (start + len));
  return reinterpret_cast<void*>(start);
}

void* map_huge(size_t bytes) {
  const size_t len = page_round(bytes);
  void* p = map_aligned(len, PROT_READ | PROT_WRITE, 0);
  // Advice only: a kernel without transparent huge pages answers EINVAL, and the block
  // works in 4 KiB pages.
  if (p) ::madvise(p, len, MADV_HUGEPAGE);
  return p;
}

// `len` bytes of address space at a 2 MiB boundary, reserved (PROT_NONE, no memory), for a
// mapping to be moved onto.
void* reserve_aligned(size_t len) { return map_aligned(len, PROT_NONE, MAP_NORESERVE); }

}  // namespace

void* reshape_host_block(void* p, size_t old_bytes, size_t new_bytes) {
  if (!p || old_bytes < kHugeMinBytes || new_bytes < kHugeMinBytes) return nullptr;
  const size_t from = page_round(old_bytes), to = page_round(new_bytes);
  if (to <= from) {
    if (to < from) ::munmap(static_cast<char*>(p) + to, from - to);
    return p;
  }
  // In place when the range after it is free (no move, nothing to align).
  if (::mremap(p, from, to, 0) != MAP_FAILED) return p;
  void* dst = reserve_aligned(to);
  if (!dst) return nullptr;
  // Replaces the reservation; the moved range keeps its advice (MADV_HUGEPAGE) and its pages.
  void* q = ::mremap(p, from, to, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
  if (q == MAP_FAILED) {
    ::munmap(dst, to);
    return nullptr;
  }
  return q;
}

void* allocate_host_block(size_t bytes, size_t alignment) {
  if (bytes >= kHugeMinBytes) return map_huge(bytes);
  return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
}

void free_host_block(void* p, size_t bytes) {
  if (!p) return;
  if (bytes >= kHugeMinBytes)
    ::munmap(p, page_round(bytes));
  else
    std::free(p);
}

}  // namespace weft::memory
