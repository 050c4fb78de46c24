// Big host blocks at 2 MiB boundaries, advised MADV_HUGEPAGE (huge_pages.h).
#include "memory/huge_pages.h"

#include <sys/mman.h>  // mremap: g++ defines _GNU_SOURCE

#include <cstdint>
#include <cstdlib>

namespace weft::memory {
namespace {

constexpr size_t kPage = 4096;

size_t page_round(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// Maps `bytes` plus 2 MiB and unmaps what lies before the first 2 MiB boundary and after the
// block's last page.
void* map_huge(size_t bytes) {
  const size_t len = page_round(bytes);
  void* m =
      ::mmap(nullptr, len + kHugeBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (at + kHugeBytes - 1) / kHugeBytes * kHugeBytes;
  if (start > at) ::munmap(m, start - at);
  if (const uintptr_t end = at + len + kHugeBytes; end > start + len)
    ::munmap(reinterpret_cast<void*>(start + len), end - (start + len));
  // Advice only: a kernel without transparent huge pages answers EINVAL, and the block
  // works in 4 KiB pages.
  ::madvise(reinterpret_cast<void*>(start), len, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(start);
}

// `len` bytes of address space at a 2 MiB boundary, reserved (PROT_NONE, no memory), for a
// mapping to be moved onto.
void* reserve_aligned(size_t len) {
  void* m = ::mmap(nullptr, len + kHugeBytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (at + kHugeBytes - 1) / kHugeBytes * kHugeBytes;
  if (start > at) ::munmap(m, start - at);
  if (const uintptr_t end = at + len + kHugeBytes; end > start + len)
    ::munmap(reinterpret_cast<void*>(start + len), end - (start + len));
  return reinterpret_cast<void*>(start);
}

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
